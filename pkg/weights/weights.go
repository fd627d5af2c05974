// Package weights plans the calls that turn a service's endpoint weights from what they are into
// what a declaration says: fleetctl apply and the kube bridge's ServiceWeights both set weights
// through the API, which has one call per weight and no expected revision.
package weights

import (
	"maps"
	"slices"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
)

// Default is the weight of a cluster or endpoint no call has set.
const Default = 100

// Change is one weight call: a cluster's weight (IP empty) or an endpoint's; Reset clears an
// endpoint weight the declaration no longer has (back to Default).
type Change struct {
	Cluster, IP string
	From, To    uint32
	Reset       bool
}

// Changes returns the calls that make have into want, a weight left out being Default. Raises
// go before cuts, so that a failure halfway never leaves the service more drained than either
// side says (from {b: 0} to {a: 0}, b comes back before a goes); within each, clusters in name
// order, then endpoints in want's order, then the resets.
func Changes(want, have *endpointv1.ServiceWeights) []Change {
	var changes []Change
	for _, c := range slices.Sorted(maps.Keys(want.GetClusterWeights())) {
		from, ok := have.GetClusterWeights()[c]
		if !ok {
			from = Default
		}
		if to := want.GetClusterWeights()[c]; to != from {
			changes = append(changes, Change{Cluster: c, From: from, To: to})
		}
	}
	for _, c := range slices.Sorted(maps.Keys(have.GetClusterWeights())) {
		if _, ok := want.GetClusterWeights()[c]; !ok && have.GetClusterWeights()[c] != Default {
			changes = append(changes, Change{Cluster: c, From: have.GetClusterWeights()[c], To: Default})
		}
	}
	endpoint := func(e *endpointv1.EndpointWeight) string { return e.GetClusterName() + "/" + e.GetIp() }
	had := map[string]uint32{}
	for _, e := range have.GetEndpointWeights() {
		had[endpoint(e)] = e.GetWeight()
	}
	wanted := map[string]bool{}
	for _, e := range want.GetEndpointWeights() {
		wanted[endpoint(e)] = true
		from, ok := had[endpoint(e)]
		if !ok {
			from = Default
		}
		if !ok || from != e.GetWeight() {
			changes = append(changes, Change{Cluster: e.GetClusterName(), IP: e.GetIp(), From: from, To: e.GetWeight()})
		}
	}
	for _, e := range have.GetEndpointWeights() {
		if !wanted[endpoint(e)] {
			changes = append(changes, Change{Cluster: e.GetClusterName(), IP: e.GetIp(), From: e.GetWeight(), To: Default, Reset: true})
		}
	}
	slices.SortStableFunc(changes, func(a, b Change) int { return cut(a) - cut(b) })
	return changes
}

func cut(c Change) int {
	if c.To >= c.From {
		return 0
	}
	return 1
}
