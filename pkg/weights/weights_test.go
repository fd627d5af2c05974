package weights

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
)

// Raises before cuts; what want leaves out goes back to the default (an endpoint's by a reset);
// settled weights make no call.
func TestChanges(t *testing.T) {
	have := &endpointv1.ServiceWeights{
		ClusterWeights:  map[string]uint32{"a": 50, "b": 30, "gone": 0},
		EndpointWeights: []*endpointv1.EndpointWeight{{ClusterName: "a", Ip: "10.0.0.1", Weight: 0}, {ClusterName: "a", Ip: "10.0.0.2", Weight: 10}},
	}
	want := &endpointv1.ServiceWeights{
		ClusterWeights:  map[string]uint32{"a": 0, "b": 100, "new": 20},
		EndpointWeights: []*endpointv1.EndpointWeight{{ClusterName: "a", Ip: "10.0.0.2", Weight: 10}, {ClusterName: "b", Ip: "10.0.1.1", Weight: 5}},
	}
	var got []string
	for _, c := range Changes(want, have) {
		got = append(got, fmt.Sprintf("%s/%s %d->%d reset=%v", c.Cluster, c.IP, c.From, c.To, c.Reset))
	}
	wantCalls := []string{
		"b/ 30->100 reset=false", "gone/ 0->100 reset=false", "a/10.0.0.1 0->100 reset=true", // raises
		"a/ 50->0 reset=false", "new/ 100->20 reset=false", "b/10.0.1.1 100->5 reset=false", // cuts
	}
	if !slices.Equal(got, wantCalls) {
		t.Fatalf("Changes:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantCalls, "\n"))
	}
	if c := Changes(want, &endpointv1.ServiceWeights{ClusterWeights: want.ClusterWeights, EndpointWeights: want.EndpointWeights}); len(c) != 0 {
		t.Fatalf("settled weights make calls: %v", c)
	}
}
