package main

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
)

// placementLabel is the cluster label the placement scenario's placement selects on; its
// value carries the run, so clusters of other runs on the same hub are never selected.
const placementLabel = "fleetsim-placement"

// placementName is the placement of the scenario's project.
const placementName = "fleetsim"

// PlacementResult is the placement scenario: a namespace following a placement that selects
// clusters by a label, and rounds of label changes that move the decision.
type PlacementResult struct {
	// BindAllAppliedMS is from BindNamespace {placement} until every decided cluster (half
	// the fleet) applied the namespace.
	BindAllAppliedMS float64 `json:"bind_all_applied_ms"`
	// Selected is, per cluster and round, from the UpdateCluster call that gave the cluster the
	// selected label until its agent applied the namespace; Deselected from the call that took
	// the label away until its agent deleted the namespace (the binding's unbind policy is
	// DELETE).
	Selected   Dist `json:"selected"`
	Deselected Dist `json:"deselected"`
	// Measured is how many clusters the rounds were measured on: the lost ones are left out.
	Measured int              `json:"measured_clusters"`
	Rounds   []PlacementRound `json:"rounds"`
}

// PlacementRound is one round: every cluster's label flipped, until the last one applied or
// removed the namespace.
type PlacementRound struct {
	AllMS float64 `json:"all_ms"`
}

// placementScenario creates a project with the global cluster set bound, labels half the fleet
// "a" and half "b", creates a placement selecting "a" and a namespace following it (unbind
// policy DELETE); then, o.rounds times, flips every cluster's label, so the decided half leaves
// (its agents delete the namespace) and the other half joins (its agents apply it).
func placementScenario(ctx context.Context, o options, h *hub, clusters []*simCluster, run string, res *Result) error {
	project := "fleetsim-" + run + "-p"
	ns := project
	pr := &PlacementResult{}
	res.Placement = pr
	if _, err := h.projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: project})); err != nil {
		return fmt.Errorf("placement: create project %s: %w", project, err)
	}
	if _, err := h.sets.BindClusterSet(ctx, connect.NewRequest(&placementv1.BindClusterSetRequest{Project: project, ClusterSet: "global"})); err != nil {
		return fmt.Errorf("placement: bind cluster set global to %s: %w", project, err)
	}
	selectedValue := run + "-a"
	label := func(c *simCluster, value string) error {
		c.labelledAt.Store(time.Now().UnixNano())
		_, err := h.clusters.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{
			Name:       c.name,
			Labels:     map[string]string{"fleetsim": "true", placementLabel: value},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}},
		}))
		if err != nil {
			return fmt.Errorf("placement: label %s %s=%s: %w", c.name, placementLabel, value, err)
		}
		return nil
	}
	var in, out []*simCluster
	for i, c := range clusters {
		if i%2 == 0 {
			in = append(in, c)
		} else {
			out = append(out, c)
		}
	}
	valueOf := func(selected bool) string {
		if selected {
			return selectedValue
		}
		return run + "-b"
	}
	// The first labels, before the placement exists: nothing to time yet.
	err := forEach(ctx, len(clusters), 0, func(i int) error { return label(clusters[i], valueOf(i%2 == 0)) })
	if err != nil {
		return err
	}
	if _, err := h.placements.CreatePlacement(ctx, connect.NewRequest(&placementv1.CreatePlacementRequest{Placement: &placementv1.Placement{
		Project: project, Name: placementName,
		Predicates: []*placementv1.Predicate{{RequiredClusterSelector: &placementv1.ClusterSelector{
			LabelSelector: &placementv1.LabelSelector{MatchLabels: map[string]string{placementLabel: selectedValue}}}}},
	}})); err != nil {
		return fmt.Errorf("placement: create placement: %w", err)
	}
	for _, c := range clusters {
		c.placementNS.Store(&ns)
		c.resetPlacementTimes()
	}
	t0 := time.Now()
	if _, err := h.projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{
		Project: project, Namespace: ns, Placement: placementName, UnbindPolicy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE})); err != nil {
		return fmt.Errorf("placement: bind namespace %s to placement %s: %w", ns, placementName, err)
	}
	at, lost, in := waitAll(ctx, in, o.timeout, func(c *simCluster) int64 { return c.pnsApplied.Load() })
	for _, c := range lost {
		res.Lost = append(res.Lost, "placement: "+c+" decided but never applied namespace "+ns)
	}
	if len(at) > 0 {
		pr.BindAllAppliedMS = ms(maxTime(at).Sub(t0))
	}
	for _, c := range out {
		if c.pnsApplied.Load() != 0 {
			res.Lost = append(res.Lost, "placement: "+c.name+" applied namespace "+ns+" though not decided")
		}
	}

	var selected, deselected []time.Duration
	for r := 0; r < o.rounds && len(in)+len(out) > 0; r++ {
		movers := append(append([]*simCluster(nil), in...), out...)
		for _, c := range movers {
			c.resetPlacementTimes()
		}
		// Every cluster's label flips: the decided ones leave, the others join.
		nIn := len(in)
		start := time.Now()
		if err := forEach(ctx, len(movers), 0, func(i int) error { return label(movers[i], valueOf(i >= nIn)) }); err != nil {
			return err
		}
		var joinedAt, leftAt []time.Time
		var lostJoin, lostLeave []string
		var joined, left []*simCluster
		joinedAt, lostJoin, joined = waitAll(ctx, out, o.timeout, func(c *simCluster) int64 { return c.pnsApplied.Load() })
		leftAt, lostLeave, left = waitAll(ctx, in, o.timeout, func(c *simCluster) int64 { return c.pnsDeleted.Load() })
		for _, c := range lostJoin {
			res.Lost = append(res.Lost, fmt.Sprintf("placement round %d: %s selected but never applied namespace %s (%s)", r, c, ns, diagnose(ctx, h, project, c, ns)))
		}
		for _, c := range lostLeave {
			res.Lost = append(res.Lost, fmt.Sprintf("placement round %d: %s deselected but never removed namespace %s (%s)", r, c, ns, diagnose(ctx, h, project, c, ns)))
		}
		for i, c := range joined {
			selected = append(selected, joinedAt[i].Sub(time.Unix(0, c.labelledAt.Load())))
		}
		for i, c := range left {
			deselected = append(deselected, leftAt[i].Sub(time.Unix(0, c.labelledAt.Load())))
		}
		pr.Rounds = append(pr.Rounds, PlacementRound{AllMS: ms(maxTime(append(joinedAt, leftAt...)).Sub(start))})
		for _, c := range joined {
			if ok, err := c.holdsNamespace(ns); err != nil || !ok {
				res.Lost = append(res.Lost, fmt.Sprintf("placement round %d: %s does not hold namespace %s (%v)", r, c.name, ns, err))
			}
		}
		for _, c := range left {
			if ok, err := c.holdsNamespace(ns); err != nil || ok {
				res.Lost = append(res.Lost, fmt.Sprintf("placement round %d: %s still holds namespace %s (%v)", r, c.name, ns, err))
			}
		}
		in, out = joined, left
		pr.Measured = len(in) + len(out)
		pr.Selected, pr.Deselected = newDist(selected), newDist(deselected)
	}
	return nil
}

// diagnose says where a lost cluster's namespace stopped: whether the placement's decision
// holds the cluster, and the hub's binding of the namespace there.
func diagnose(ctx context.Context, h *hub, project, cluster, ns string) string {
	decided := "not in the decision"
	d, err := h.placements.GetPlacementDecisions(ctx, connect.NewRequest(&placementv1.GetPlacementDecisionsRequest{Project: project, Name: placementName}))
	if err != nil {
		decided = "decision: " + err.Error()
	} else {
		for _, g := range d.Msg.GetDecisions().GetGroups() {
			for _, p := range g.GetPages() {
				for _, c := range p.GetClusters() {
					if c.GetClusterName() == cluster {
						decided = "in the decision"
					}
				}
			}
		}
	}
	binding := "no binding"
	b, err := h.projects.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: project, Cluster: cluster}))
	if err != nil {
		binding = "bindings: " + err.Error()
	}
	for _, nb := range b.Msg.GetBindings() {
		if nb.GetNamespace() == ns {
			binding = fmt.Sprintf("binding %s %s: %s", nb.GetPhase(), nb.GetReason(), nb.GetMessage())
		}
	}
	return decided + "; " + binding
}

// holdsNamespace reports whether the fake cluster holds namespace ns.
func (c *simCluster) holdsNamespace(ns string) (bool, error) {
	_, err := c.dyn.Tracker().Get(namespacesGVR, "", ns)
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, err
}
