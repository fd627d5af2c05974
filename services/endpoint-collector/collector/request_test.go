package collector

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/server"
)

var getRequestSeeds = []string{
	`{"namespace":"bench","name":"cart"}`,
	`{"namespace":"bench","name":"cart","filter":"ENDPOINT_FILTER_ALL","portName":"http"}`,
	` { "name" : "cart" , "namespace":"bench", "filter": 2, "port_name":"grpc" } `,
	`{}`,
	`{"namespace":"","name":"","filter":0,"portName":""}`,
	`{"namespace":"bench","name":"cart","filter":"ENDPOINT_FILTER_UNKNOWN"}`,
	`{"namespace":"bench","name":"cart","filter":7}`,
	`{"namespace":"bench","name":"cart","filter":01}`,
	`{"namespace":"bench","name":"cart","filter":1.0}`,
	`{"namespace":"bench","name":"cart","filter":-1}`,
	`{"namespace":"bench","name":"cart","filter":null}`,
	`{"namespace":"b\u0065nch","name":"cart"}`,
	`{"namespace":"bench","name":"cärt"}`,
	`{"namespace":"bench","name":"cart","other":1}`,
	`{"namespace":"bench","namespace":"cart"}`,
	`{"portName":"a","port_name":"b"}`,
	`{"namespace":"bench",}`,
	`{"namespace":"bench"} x`,
	`{"namespace":"bench"`,
	`[]`,
}

// What clients send is decoded without protojson, to what protojson decodes.
func TestDecodeGetRequest(t *testing.T) {
	for _, in := range []*endpointv1.GetServiceEndpointsRequest{
		{Namespace: "bench", Name: "cart"},
		{Namespace: "bench", Name: "cart", Filter: endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL, PortName: "http"},
		{Namespace: "a-b", Name: "c.d", Filter: endpointv1.EndpointFilter_ENDPOINT_FILTER_READY_OR_TERMINATING},
		{},
	} {
		data, err := protojson.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var got endpointv1.GetServiceEndpointsRequest
		if !decodeGetRequest(data, &got) {
			t.Errorf("%s: not decoded by the fast path", data)
		} else if !proto.Equal(&got, in) {
			t.Errorf("%s: decoded %v", data, &got)
		}
	}
	for _, s := range getRequestSeeds {
		checkGetRequest(t, []byte(s))
	}
}

func FuzzDecodeGetRequest(f *testing.F) {
	for _, s := range getRequestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkGetRequest)
}

// checkGetRequest: what the fast path decodes, the server's strict decoder (as the JSON codec
// calls it) decodes to
// the same message; what it does not, it leaves untouched.
func checkGetRequest(t *testing.T, data []byte) {
	fast := &endpointv1.GetServiceEndpointsRequest{Namespace: "untouched"}
	if !decodeGetRequest(data, fast) {
		if fast.Namespace != "untouched" {
			t.Fatalf("%q: refused but changed the message", data)
		}
		return
	}
	var slow endpointv1.GetServiceEndpointsRequest
	if err := server.UnmarshalJSON(data, &slow); err != nil {
		t.Fatalf("%q: fast path decoded %v, protojson refuses: %v", data, fast, err)
	}
	if !proto.Equal(fast, &slow) {
		t.Fatalf("%q: fast path %v, protojson %v", data, fast, &slow)
	}
}
