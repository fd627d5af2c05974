package clusterimport_test

import (
	"testing"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// Every view cluster-import declares is granted to it in the callout's permission table.
func TestViewsAreGranted(t *testing.T) {
	testkit.ViewGrants(t, natsauth.ServiceClusterImport, clusterimport.Projections())
}
