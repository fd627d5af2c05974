package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
)

func TestUnmarshalJSONNamesTheFieldPath(t *testing.T) {
	cases := []struct {
		name    string
		msg     proto.Message
		body    string
		wantErr string // "" means accepted; else the whole message
	}{
		{name: "known fields, JSON and proto names", msg: &placementv1.CreatePlacementRequest{},
			body: `{"placement":{"project":"p","name":"n","number_of_clusters":2,"clusterSets":["a"],"createTime":"2026-01-01T00:00:00Z",
				"predicates":[{"requiredClusterSelector":{"labelSelector":{"matchLabels":{"a b":"c"}}}}]}}`},
		{name: "a misspelt celSelector in the second predicate", msg: &placementv1.CreatePlacementRequest{},
			body:    `{"placement":{"project":"p","name":"n","predicates":[{"requiredClusterSelector":{}},{"requiredClusterSelector":{"celSelectors":{"celExpressions":["true"]}}}]}}`,
			wantErr: `placement.predicates[1].required_cluster_selector.celSelectors: unknown field`},
		{name: "an unknown field inside celSelector", msg: &placementv1.CreatePlacementRequest{},
			body:    `{"placement":{"project":"p","name":"n","predicates":[{"requiredClusterSelector":{"celSelector":{"celExpressions":["true"],"bogus":1}}}]}}`,
			wantErr: `placement.predicates[0].required_cluster_selector.cel_selector.bogus: unknown field`},
		{name: "unknown top-level field", msg: &placementv1.CreateClusterSetRequest{}, body: `{"name":"s","bogus":1}`,
			wantErr: `bogus: unknown field`},
		{name: "OCM-style metadata on a placement", msg: &placementv1.CreatePlacementRequest{},
			body:    `{"placement":{"project":"p","name":"n","metadata":{"annotations":{"a":"b"}}}}`,
			wantErr: `placement.metadata: unknown field`},
		{name: "unknown field that is not an identifier", msg: &placementv1.CreateClusterSetRequest{}, body: `{"a.b":1}`,
			wantErr: `["a.b"]: unknown field`},
		{name: "unknown field inside a map value", msg: &placementv1.CreatePlacementRequest{},
			body:    `{"placement":{"decisionStrategy":{"groups":[{"groupClusterSelector":{"labelSelector":{"matchLabels":{"x":"y"},"bogus":true}}}]}}}`,
			wantErr: `placement.decision_strategy.groups[0].group_cluster_selector.label_selector.bogus: unknown field`},
		{name: "unknown enum name", msg: &placementv1.CreateClusterSetRequest{}, body: `{"name":"s","selector":{"type":"errorType"}}`,
			wantErr: `selector.type: unknown value "errorType" of enum fleetstream.placement.v1.SelectorType (one of SELECTOR_TYPE_UNSPECIFIED, SELECTOR_TYPE_EXCLUSIVE_LABEL, SELECTOR_TYPE_LABEL_SELECTOR)`},
		{name: "undeclared enum number", msg: &placementv1.CreateClusterSetRequest{}, body: `{"name":"s","selector":{"type":99}}`,
			wantErr: `selector.type: unknown value 99 of enum fleetstream.placement.v1.SelectorType (one of SELECTOR_TYPE_UNSPECIFIED, SELECTOR_TYPE_EXCLUSIVE_LABEL, SELECTOR_TYPE_LABEL_SELECTOR)`},
		{name: "declared enum number", msg: &placementv1.CreateClusterSetRequest{}, body: `{"name":"s","selector":{"type":2}}`},
		{name: "undeclared enum number in a list", msg: &placementv1.CreatePlacementRequest{},
			body:    `{"placement":{"prioritizerPolicy":{"configurations":[{},{"scoreCoordinate":{"type":7}}]}}}`,
			wantErr: `placement.prioritizer_policy.configurations[1].score_coordinate.type: unknown value 7 of enum fleetstream.placement.v1.ScoreCoordinateType`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := UnmarshalJSON([]byte(tc.body), tc.msg)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("accepted: %v", tc.msg)
			case tc.wantErr != "" && !strings.HasPrefix(err.Error(), tc.wantErr):
				t.Fatalf("got  %v\nwant %s", err, tc.wantErr)
			}
		})
	}
}

// An error never echoes a large input: an unknown field of 100 kB, or malformed JSON protojson
// quotes, is cut short.
func TestUnmarshalJSONErrorsAreShort(t *testing.T) {
	long := strings.Repeat("x", 100_000)
	for name, body := range map[string]string{
		"unknown field":     `{"` + long + `":1}`,
		"unknown enum name": `{"selector":{"type":"` + long + `"}}`,
		"not a string":      `{"name":["` + long + `"]}`,
	} {
		err := UnmarshalJSON([]byte(body), &placementv1.CreateClusterSetRequest{})
		if err == nil || len(err.Error()) > 512 {
			t.Errorf("%s: %d bytes of error: %.100v", name, len(err.Error()), err)
		}
	}
}

// Binary protobuf keeps unknown fields (a newer client's fields reach an older server intact),
// and refuses an enum number its enum does not declare.
func TestUnmarshalBinary(t *testing.T) {
	known, err := proto.Marshal(&placementv1.CreateClusterSetRequest{Name: "s",
		Selector: &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR}})
	if err != nil {
		t.Fatal(err)
	}
	future := protowire.AppendString(protowire.AppendTag(bytes.Clone(known), 99, protowire.BytesType), "from a newer schema")
	var got placementv1.CreateClusterSetRequest
	if err := UnmarshalBinary(future, &got); err != nil {
		t.Fatalf("unknown field refused: %v", err)
	}
	if got.GetName() != "s" || len(got.ProtoReflect().GetUnknown()) == 0 {
		t.Fatalf("decoded %v with unknown bytes %q", &got, got.ProtoReflect().GetUnknown())
	}

	bad, err := proto.Marshal(&placementv1.CreatePlacementRequest{Placement: &placementv1.Placement{
		PrioritizerPolicy: &placementv1.PrioritizerPolicy{Configurations: []*placementv1.PrioritizerConfig{{},
			{ScoreCoordinate: &placementv1.ScoreCoordinate{Type: 42}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	err = UnmarshalBinary(bad, &placementv1.CreatePlacementRequest{})
	const want = "placement.prioritizer_policy.configurations[1].score_coordinate.type: unknown value 42 of enum fleetstream.placement.v1.ScoreCoordinateType"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %v, want %s", err, want)
	}
}

// echoSets answers CreateClusterSet with the set it was sent and streams nothing.
type echoSets struct {
	placementv1connect.UnimplementedClusterSetServiceHandler
}

func (echoSets) CreateClusterSet(_ context.Context, req *connect.Request[placementv1.CreateClusterSetRequest]) (*connect.Response[placementv1.CreateClusterSetResponse], error) {
	return connect.NewResponse(&placementv1.CreateClusterSetResponse{ClusterSet: &placementv1.ClusterSet{
		Name: req.Msg.GetName(), Selector: req.Msg.GetSelector()}}), nil
}

func (echoSets) GetClusterSet(_ context.Context, req *connect.Request[placementv1.GetClusterSetRequest]) (*connect.Response[placementv1.GetClusterSetResponse], error) {
	return connect.NewResponse(&placementv1.GetClusterSetResponse{ClusterSet: &placementv1.ClusterSet{Name: req.Msg.GetName()}}), nil
}

// Every way a Connect handler of the server reads a request goes through the strict codecs:
// JSON bodies with and without a charset, GET query messages, streams, gRPC and Connect binary.
func TestServerDecodesRequestsStrictly(t *testing.T) {
	s, err := New(Config{InsecureDev: true}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	s.Authorize(allowAll{})
	s.Handle(placementv1connect.NewClusterSetServiceHandler(echoSets{}, s.HandlerOptions()...))
	s.Handle(placementv1connect.NewPlacementServiceHandler(placementv1connect.UnimplementedPlacementServiceHandler{}, s.HandlerOptions()...))
	hs := httptest.NewUnstartedServer(s.Handler())
	hs.EnableHTTP2 = true
	hs.StartTLS()
	t.Cleanup(hs.Close)
	base := hs.URL + "/fleetstream.placement.v1.ClusterSetService/"

	post := func(t *testing.T, method, ctype, body string) (int, string) {
		t.Helper()
		res, err := hs.Client().Post(base+method, ctype, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(data)
	}
	for _, ctype := range []string{"application/json", "application/json; charset=utf-8", "application/json; charset=UTF-8"} {
		t.Run(ctype, func(t *testing.T) {
			code, body := post(t, "CreateClusterSet", ctype, `{"name":"s","selector":{"type":"SELECTOR_TYPE_LABEL_SELECTOR","celSelector":{}}}`)
			if code != http.StatusBadRequest || !strings.Contains(body, `"invalid_argument"`) || !strings.Contains(body, `"message":"unmarshal message: selector.celSelector: unknown field"`) {
				t.Fatalf("HTTP %d %s", code, body)
			}
			code, body = post(t, "CreateClusterSet", ctype, `{"name":"s","selector":{"type":"errorType"}}`)
			if code != http.StatusBadRequest || !strings.Contains(body, `selector.type: unknown value \"errorType\"`) {
				t.Fatalf("HTTP %d %s", code, body)
			}
			code, body = post(t, "CreateClusterSet", ctype, `{"name":"s","selector":{"type":"SELECTOR_TYPE_LABEL_SELECTOR"}}`)
			if code != http.StatusOK || !strings.Contains(body, "SELECTOR_TYPE_LABEL_SELECTOR") {
				t.Fatalf("a good request: HTTP %d %s", code, body)
			}
		})
	}
	t.Run("GET", func(t *testing.T) {
		q := url.Values{"connect": {"v1"}, "encoding": {"json"}, "message": {`{"name":"s","nickname":"x"}`}}
		res, err := hs.Client().Get(base + "GetClusterSet?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), "nickname: unknown field") {
			t.Fatalf("HTTP %d %s", res.StatusCode, data)
		}
	})
	t.Run("Connect streaming JSON", func(t *testing.T) {
		payload := []byte(`{"project":"p","name":"n","nickname":"x"}`)
		var env bytes.Buffer
		env.WriteByte(0)
		_ = binary.Write(&env, binary.BigEndian, uint32(len(payload)))
		env.Write(payload)
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/fleetstream.placement.v1.PlacementService/WatchPlacementDecisions", &env)
		req.Header.Set("Content-Type", "application/connect+json")
		res, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		// Refused while decoding: the (unimplemented) handler is never reached.
		if !strings.Contains(string(data), "invalid_argument") || !strings.Contains(string(data), "nickname: unknown field") {
			t.Fatalf("HTTP %d %q", res.StatusCode, data)
		}
	})

	clients := map[string]placementv1connect.ClusterSetServiceClient{
		"connect binary": placementv1connect.NewClusterSetServiceClient(hs.Client(), hs.URL),
		"grpc":           placementv1connect.NewClusterSetServiceClient(hs.Client(), hs.URL, connect.WithGRPC()),
		"grpc-web":       placementv1connect.NewClusterSetServiceClient(hs.Client(), hs.URL, connect.WithGRPCWeb()),
	}
	for name, c := range clients {
		t.Run(name, func(t *testing.T) {
			// A field from a newer schema is kept by binary decoding, not refused.
			future := &placementv1.CreateClusterSetRequest{Name: "s"}
			future.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "newer"))
			res, err := c.CreateClusterSet(t.Context(), connect.NewRequest(future))
			if err != nil || res.Msg.GetClusterSet().GetName() != "s" {
				t.Fatalf("unknown field refused: %v", err)
			}
			_, err = c.CreateClusterSet(t.Context(), connect.NewRequest(&placementv1.CreateClusterSetRequest{Name: "s",
				Selector: &placementv1.ClusterSetSelector{Type: 99}}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "selector.type: unknown value 99") {
				t.Fatalf("enum 99: %v", err)
			}
		})
	}
}

// The enum check after binary decoding, against decoding alone: a request without enums costs
// a cache lookup, one with some a walk of its set fields.
func BenchmarkUnmarshalBinary(b *testing.B) {
	msgs := map[string]proto.Message{
		"no enums": &placementv1.GetClusterSetRequest{Name: "default"},
		"endpoints query": &endpointv1.GetServiceEndpointsRequest{Namespace: "shop", Name: "cart",
			Filter: endpointv1.EndpointFilter_ENDPOINT_FILTER_READY_OR_TERMINATING},
		"placement": &placementv1.CreatePlacementRequest{Placement: &placementv1.Placement{Project: "p", Name: "n",
			Predicates: []*placementv1.Predicate{{RequiredClusterSelector: &placementv1.ClusterSelector{}}},
			PrioritizerPolicy: &placementv1.PrioritizerPolicy{Configurations: []*placementv1.PrioritizerConfig{
				{ScoreCoordinate: &placementv1.ScoreCoordinate{Type: placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_BUILT_IN, BuiltIn: "Steady"}}}}}},
	}
	for name, m := range msgs {
		data, err := proto.Marshal(m)
		if err != nil {
			b.Fatal(err)
		}
		for _, dec := range []struct {
			name string
			fn   func([]byte, proto.Message) error
		}{{"proto.Unmarshal", proto.Unmarshal}, {"UnmarshalBinary", UnmarshalBinary}} {
			b.Run(name+"/"+dec.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					out := m.ProtoReflect().New().Interface()
					if err := dec.fn(data, out); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
