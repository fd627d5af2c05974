package natsauth_test

import (
	"slices"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// View engines park poison events on fleet.dlq.<stream>.view-<view>: each service may publish
// there for the streams its views fold, or a poison event would stall its view under the callout.
func TestServicesMayDeadLetterTheirViewsPoison(t *testing.T) {
	for service, streams := range map[string][]string{
		natsauth.ServiceClusterImport:     {subjects.ClusterStream, subjects.AgentStreamName},
		natsauth.ServiceNamespaceBinding:  {subjects.NamespaceStream, subjects.PlacementStream},
		natsauth.ServiceRBACSync:          {subjects.RBACStream},
		natsauth.ServiceEndpointCollector: {subjects.EndpointStream},
	} {
		perms, ok := natsauth.Identity{Kind: natsauth.KindService, Name: service}.Permissions()
		if !ok {
			t.Fatalf("%s has no permissions", service)
		}
		for _, s := range streams {
			if want := "fleet.dlq." + s + ".*"; !slices.Contains(perms.Publish, want) {
				t.Errorf("%s may not publish %s", service, want)
			}
		}
	}
}
