package namespacebinding_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

// The scenario on three real kube-apiservers with their agents: a placement of two
// clusters with a namespace bound to it; one agent stops, its cluster is tainted unreachable
// after the grace and the namespace moves to the third cluster; the agent returns and Steady
// keeps the decision.
func TestIntegrationNamespaceFollowsPlacementAcrossAnOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three kube-apiservers")
	}
	const grace = 2 * time.Second
	j := testkit.StartJetStream(t)
	e := startHub(t, j, namespacebinding.Config{ReleaseInterval: 200 * time.Millisecond},
		clusterimport.Config{UnreachableAfter: grace, CheckInterval: 200 * time.Millisecond})
	members := map[string]*member{}
	for _, n := range []string{"c1", "c2", "c3"} {
		members[n] = &member{name: n, kube: testkit.StartKube(t)}
	}
	e.register(t, "c1", "c2", "c3")
	for _, n := range []string{"c1", "c2", "c3"} {
		members[n].startAgent(t, j)
	}
	e.createProject(t, "team-a")
	if _, err := e.bindSet("team-a", "global"); err != nil {
		t.Fatal(err)
	}
	// Ties break by name once every agent reported: c1 and c2. Until an agent reports, its
	// cluster is tainted unreachable; a placement decided then would keep its choice (Steady).
	e.waitUntainted(t, converge, "c1", "c2", "c3")
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "two", NumberOfClusters: ptr[int32](2)})
	testkit.Eventually(t, converge, func() error {
		if got := decided(e.decisions(t, "team-a", "two")); !slices.Equal(got, []string{"c1", "c2"}) {
			return fmt.Errorf("decided %v, want c1 and c2 once their agents report", got)
		}
		return nil
	})
	if _, err := e.bindToPlacement("team-a", "web", "two", hard("cpu", "1")); err != nil {
		t.Fatal(err)
	}
	labelled := func(m *member) error {
		ns, ok := m.namespace(t, "web")
		if !ok || ns.Labels[namespacebinding.ProjectLabel] != "team-a" {
			return fmt.Errorf("namespace web on %s: %v (present %v)", m.name, ns, ok)
		}
		return nil
	}
	testkit.Eventually(t, converge, func() error {
		for _, n := range []string{"c1", "c2"} {
			if err := labelled(members[n]); err != nil {
				return err
			}
		}
		return nil
	})
	if _, ok := members["c3"].namespace(t, "web"); ok {
		t.Fatal("web exists on c3, which the placement did not decide")
	}

	// c1's agent stops: after the grace c1 is tainted unreachable (NoSelect), the placement
	// drops it for c3, and web is made on c3.
	stopped := time.Now()
	members["c1"].stop()
	testkit.Eventually(t, converge, func() error { return labelled(members["c3"]) })
	moved := time.Since(stopped)
	t.Logf("web on c3 %v after c1's agent stopped (grace %v)", moved.Round(100*time.Millisecond), grace)
	if moved > grace+15*time.Second {
		t.Fatalf("web reached c3 %v after the outage began, want within the grace plus a few seconds", moved)
	}
	if got := decided(e.decisions(t, "team-a", "two")); !slices.Equal(got, []string{"c2", "c3"}) {
		t.Fatalf("decided %v after the outage, want c2 and c3", got)
	}
	// c1's binding is released (KEEP) but its agent cannot confirm: Terminating.
	e.waitBinding(t, "team-a", "c1", "web", phase(projectv1.BindingPhase_BINDING_PHASE_TERMINATING, ""))

	// The agent returns: c1 is untainted, Steady keeps c2 and c3, and c1's agent carries out
	// the release (KEEP: the namespace stays, without the project's label).
	members["c1"].startAgent(t, j)
	testkit.Eventually(t, converge, func() error {
		ns, ok := members["c1"].namespace(t, "web")
		if !ok {
			return fmt.Errorf("web on c1 was deleted; the policy is KEEP")
		}
		if _, still := ns.Labels[namespacebinding.ProjectLabel]; still {
			return fmt.Errorf("web on c1 still labelled %v", ns.Labels)
		}
		if _, ok := e.binding(t, "team-a", "c1", "web"); ok {
			return fmt.Errorf("c1's binding of web not yet released")
		}
		return nil
	})
	// The scheduler has seen c1 untainted (its agent reports again) and decided on it.
	e.waitUntainted(t, converge, "c1")
	e.scheduled(t)
	if got := decided(e.decisions(t, "team-a", "two")); !slices.Equal(got, []string{"c2", "c3"}) {
		t.Fatalf("decided %v after c1 returned, want Steady to keep c2 and c3", got)
	}
	for _, n := range []string{"c2", "c3"} {
		if err := labelled(members[n]); err != nil {
			t.Fatal(err)
		}
	}
}
