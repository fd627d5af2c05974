package fleetd_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// probeField is a field no Fleetstream message has.
const probeField = "fleetstreamProbe"

// probe is one request body and the start of the error message it must draw.
type probe struct {
	body string
	want string
}

// probeDepth bounds how deep into a request's message fields the probes go (recursive types
// such as a label selector's expressions would otherwise never end).
const probeDepth = 4

// unknownFieldProbes returns, for request type md, a body with probeField at the top and one
// with it inside every message field md reaches, each with the path the error must name.
func unknownFieldProbes(md protoreflect.MessageDescriptor) []probe {
	var out []probe
	var walk func(md protoreflect.MessageDescriptor, depth int, wrap func(string) string, path string)
	walk = func(md protoreflect.MessageDescriptor, depth int, wrap func(string) string, path string) {
		out = append(out, probe{body: wrap(`{"` + probeField + `":1}`), want: strings.TrimPrefix(path+"."+probeField, ".") + ": unknown field"})
		if depth == probeDepth {
			return
		}
		eachMessageField(md, func(fd protoreflect.FieldDescriptor, sub protoreflect.MessageDescriptor, inner func(string) string, seg string) {
			walk(sub, depth+1, func(s string) string { return wrap(inner(s)) }, path+seg)
		})
	}
	walk(md, 0, func(s string) string { return s }, "")
	return out
}

// enumProbes returns, for request type md, a body setting every enum field md reaches to an
// undeclared name and one to an undeclared number, each with the path the error must name.
func enumProbes(md protoreflect.MessageDescriptor) []probe {
	var out []probe
	var walk func(md protoreflect.MessageDescriptor, depth int, wrap func(string) string, path string)
	walk = func(md protoreflect.MessageDescriptor, depth int, wrap func(string) string, path string) {
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.Kind() != protoreflect.EnumKind || fd.IsMap() {
				continue
			}
			p := strings.TrimPrefix(path+"."+string(fd.Name()), ".")
			for _, v := range []string{`"errorType"`, `99`} {
				val, at := v, p
				if fd.IsList() {
					val, at = "["+v+"]", p+"[0]"
				}
				out = append(out, probe{body: wrap(`{"` + fd.JSONName() + `":` + val + `}`), want: at + ": unknown value " + v + " of enum " + string(fd.Enum().FullName())})
			}
		}
		if depth == probeDepth {
			return
		}
		eachMessageField(md, func(fd protoreflect.FieldDescriptor, sub protoreflect.MessageDescriptor, inner func(string) string, seg string) {
			walk(sub, depth+1, func(s string) string { return wrap(inner(s)) }, path+seg)
		})
	}
	walk(md, 0, func(s string) string { return s }, "")
	return out
}

// eachMessageField calls f for every field of md holding Fleetstream messages (singly, in a
// list or as map values), with how to nest a value of the sub-message there and the path
// segment of that place.
func eachMessageField(md protoreflect.MessageDescriptor, f func(fd protoreflect.FieldDescriptor, sub protoreflect.MessageDescriptor, inner func(string) string, seg string)) {
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		sub := fd.Message()
		if fd.IsMap() {
			sub = fd.MapValue().Message()
		}
		if sub == nil || !strings.HasPrefix(string(sub.FullName()), "fleetstream.") {
			continue // scalars, and well-known types with JSON forms of their own
		}
		key := `"` + fd.JSONName() + `":`
		switch {
		case fd.IsMap():
			f(fd, sub, func(s string) string { return `{` + key + `{"k":` + s + `}}` }, "."+string(fd.Name())+`["k"]`)
		case fd.IsList():
			f(fd, sub, func(s string) string { return `{` + key + `[` + s + `]}` }, "."+string(fd.Name())+"[0]")
		default:
			f(fd, sub, func(s string) string { return `{` + key + s + `}` }, "."+string(fd.Name()))
		}
	}
}

// strictClient calls fleetd's API as the platform admin with raw bodies, unary or as a
// Connect server stream, JSON or binary, and returns the error code ("" when the call was let
// through) and message.
type strictClient struct{ base string }

func (c strictClient) call(t *testing.T, proc, codec string, payload []byte, streaming bool) (code, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	ctype := "application/" + codec
	if streaming {
		var env bytes.Buffer
		env.WriteByte(0)
		_ = binary.Write(&env, binary.BigEndian, uint32(len(payload)))
		env.Write(payload)
		payload, ctype = env.Bytes(), "application/connect+"+codec
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+proc, bytes.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		if streaming && ctx.Err() != nil {
			return "", "" // a watch with nothing to send yet
		}
		t.Fatalf("%s: %v", proc, err)
	}
	defer res.Body.Close()
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if !streaming {
		data, _ := io.ReadAll(res.Body)
		if res.StatusCode == http.StatusOK {
			return "", ""
		}
		if err := json.Unmarshal(data, &e); err != nil || e.Code == "" {
			t.Fatalf("%s: HTTP %d with %.200q", proc, res.StatusCode, data)
		}
		return e.Code, e.Message
	}
	var hdr [5]byte
	if _, err := io.ReadFull(res.Body, hdr[:]); err != nil {
		if ctx.Err() != nil {
			return "", "" // still open: a running watch
		}
		t.Fatalf("%s: stream ended without end message: %v", proc, err)
	}
	frame := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
	if _, err := io.ReadFull(res.Body, frame); err != nil && ctx.Err() == nil {
		t.Fatalf("%s: %v", proc, err)
	}
	if hdr[0]&0x02 == 0 {
		return "", "" // a message: let through
	}
	var end struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(frame, &end); err != nil {
		t.Fatalf("%s: end message %q: %v", proc, frame, err)
	}
	if end.Error == nil {
		return "", ""
	}
	return end.Error.Code, end.Error.Message
}

// TestEveryRequestRefusesUnknownJSON sends every request message of every service to a real
// fleetd as Connect JSON with a field it does not have (at the top and inside every message
// field the request reaches), and every enum field with an undeclared name and number, and
// expects invalid_argument naming the field's path. Connect's own JSON codec drops unknown
// fields and unknown enum names: a placement with OCM's celSelector was stored without it and
// matched every cluster.
func TestEveryRequestRefusesUnknownJSON(t *testing.T) {
	inst, _ := startFleetd(t)
	api := strictClient{base: "http://" + inst.Addr}
	procs := procedures()
	if len(procs) < 30 {
		t.Fatalf("found only %d procedures: are the generated packages linked?", len(procs))
	}
	calls, enums := 0, 0
	for _, proc := range slices.Sorted(maps.Keys(procs)) {
		m := procs[proc]
		probes := unknownFieldProbes(m.Input())
		ep := enumProbes(m.Input())
		enums += len(ep)
		for _, p := range append(probes, ep...) {
			calls++
			code, msg := api.call(t, proc, "json", []byte(p.body), m.IsStreamingServer())
			if code != "invalid_argument" || !strings.Contains(msg, p.want) {
				t.Errorf("%s %s: %s %q, want invalid_argument naming %q", proc, p.body, code, msg, p.want)
			}
		}
	}
	if enums == 0 {
		t.Fatal("no request has an enum field: the enum probes tested nothing")
	}
	t.Logf("%d procedures, %d refused requests (%d with bad enum values)", len(procs), calls, enums)
}

// TestBinaryRequestsKeepUnknownFields: binary protobuf is how a newer client talks to an older
// server, so a field the server does not know is kept (not refused): every procedure answers
// the matrix's request with a field from a newer schema added exactly as it answers it
// without. An undeclared enum number is refused in binary too.
func TestBinaryRequestsKeepUnknownFields(t *testing.T) {
	inst, _ := startFleetd(t)
	api := strictClient{base: "http://" + inst.Addr}
	procs := procedures()
	for _, proc := range slices.Sorted(maps.Keys(procs)) {
		row, ok := matrix[proc]
		if !ok {
			continue // reported by TestEveryProcedureHasARule
		}
		m := procs[proc]
		req := dynamicpb.NewMessage(m.Input())
		if err := protojson.Unmarshal([]byte(row.body), req); err != nil {
			t.Fatalf("%s: matrix body %s: %v", proc, row.body, err)
		}
		plain, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		future := protowire.AppendString(protowire.AppendTag(bytes.Clone(plain), 999, protowire.BytesType), "from a newer schema")
		wantCode, wantMsg := api.call(t, proc, "proto", plain, m.IsStreamingServer())
		code, msg := api.call(t, proc, "proto", future, m.IsStreamingServer())
		if code != wantCode || msg != wantMsg {
			t.Errorf("%s: with an unknown field %s %q, without %s %q", proc, code, msg, wantCode, wantMsg)
		}
	}

	// And one that must succeed: a cluster registered with an unknown field exists after.
	reg := dynamicpb.NewMessage(procs[procRegister].Input())
	if err := protojson.Unmarshal([]byte(`{"name":"newer-client"}`), reg); err != nil {
		t.Fatal(err)
	}
	body, _ := proto.Marshal(reg)
	body = protowire.AppendVarint(protowire.AppendTag(body, 999, protowire.VarintType), 1)
	if code, msg := api.call(t, procRegister, "proto", body, false); code != "" {
		t.Fatalf("register with an unknown field: %s %s", code, msg)
	}
	get := dynamicpb.NewMessage(procs["/fleetstream.cluster.v1.ClusterService/GetCluster"].Input())
	_ = protojson.Unmarshal([]byte(`{"name":"newer-client"}`), get)
	body, _ = proto.Marshal(get)
	if code, msg := api.call(t, "/fleetstream.cluster.v1.ClusterService/GetCluster", "proto", body, false); code != "" {
		t.Fatalf("the cluster registered with an unknown field: %s %s", code, msg)
	}

	// Binary carries enum numbers only: 99 is refused with its path.
	set := dynamicpb.NewMessage(procs["/fleetstream.placement.v1.ClusterSetService/CreateClusterSet"].Input())
	if err := protojson.Unmarshal([]byte(`{"name":"s99","selector":{"type":99}}`), set); err != nil {
		t.Fatal(err)
	}
	body, _ = proto.Marshal(set)
	code, msg := api.call(t, "/fleetstream.placement.v1.ClusterSetService/CreateClusterSet", "proto", body, false)
	if code != "invalid_argument" || !strings.Contains(msg, "selector.type: unknown value 99") {
		t.Fatalf("selector type 99 in binary: %s %q", code, msg)
	}
}

// The attack of the issue, end to end: a predicate with a selector the server does not know (here
// OCM's celSelector misspelt) is refused, not stored as a predicate matching every cluster; the
// selector it knows is stored whole.
func TestPlacementWithUnknownSelectorIsRefused(t *testing.T) {
	inst, _ := startFleetd(t)
	api := strictClient{base: "http://" + inst.Addr}
	must := func(proc, body string) {
		t.Helper()
		if code, msg := api.call(t, proc, "json", []byte(body), false); code != "" {
			t.Fatalf("%s %s: %s %s", proc, body, code, msg)
		}
	}
	must(procCreateProject, `{"name":"team-a"}`)
	const (
		create = "/fleetstream.placement.v1.PlacementService/CreatePlacement"
		get    = "/fleetstream.placement.v1.PlacementService/GetPlacement"
	)
	body := `{"placement":{"project":"team-a","name":"prod-only","predicates":[{"requiredClusterSelector":{"celSelectors":{"celExpressions":["managedCluster.metadata.labels[\"env\"] == \"prod\""]}}}]}}`
	code, msg := api.call(t, create, "json", []byte(body), false)
	if code != "invalid_argument" || !strings.Contains(msg, "placement.predicates[0].required_cluster_selector.celSelectors: unknown field") {
		t.Fatalf("placement with an unknown selector: %s %q", code, msg)
	}
	code, msg = api.call(t, get, "json", []byte(`{"project":"team-a","name":"prod-only"}`), false)
	if code != "not_found" {
		t.Fatalf("the refused placement: %s %q, want not_found", code, msg)
	}
	must(create, strings.Replace(body, "celSelectors", "celSelector", 1))
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, api.base+get, strings.NewReader(`{"project":"team-a","name":"prod-only"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if got, _ := io.ReadAll(res.Body); res.StatusCode != http.StatusOK || !strings.Contains(string(got), `managedCluster.metadata.labels`) {
		t.Fatalf("the stored placement lost its CEL selector: HTTP %d %s", res.StatusCode, got)
	}
}
