package rbacsync_test

import (
	"testing"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// Every view rbac-sync declares is granted to it in the callout's permission table.
func TestViewsAreGranted(t *testing.T) {
	testkit.ViewGrants(t, natsauth.ServiceRBACSync, rbacsync.Projections())
}
