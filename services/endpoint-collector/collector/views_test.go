package collector_test

import (
	"testing"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// Every view the collector declares is granted to it in the callout's permission table.
func TestViewsAreGranted(t *testing.T) {
	testkit.ViewGrants(t, natsauth.ServiceEndpointCollector, collector.Projections())
}
