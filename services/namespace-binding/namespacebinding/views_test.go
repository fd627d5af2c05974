package namespacebinding_test

import (
	"slices"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

// Every view namespace-binding declares, placement's included, is granted to it in the
// callout's permission table.
func TestViewsAreGranted(t *testing.T) {
	testkit.ViewGrants(t, natsauth.ServiceNamespaceBinding, namespacebinding.Projections())
}

// tools/chaos indexes Projections(): its order is part of the service's contract.
func TestProjectionsOrder(t *testing.T) {
	var names []string
	for _, p := range namespacebinding.Projections() {
		names = append(names, p.Name)
	}
	want := []string{"ns-projects", "ns-bindings", "desired-namespaces", "placement-clustersets", "placement-clusterset-bindings",
		"placement-clusterset-roles", "placement-placements", "placement-decisions", "placement-addon-scores", "placement-namespaces"}
	if !slices.Equal(names, want) {
		t.Errorf("Projections() = %v, want %v", names, want)
	}
}
