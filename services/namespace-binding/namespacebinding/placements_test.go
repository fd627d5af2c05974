package namespacebinding_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

func ptr[T any](v T) *T { return &v }

// predicate matches clusters with all the given labels.
func predicate(kv ...string) *placementv1.Predicate {
	return &placementv1.Predicate{RequiredClusterSelector: &placementv1.ClusterSelector{
		LabelSelector: &placementv1.LabelSelector{MatchLabels: hard(kv...)}}}
}

func (e *env) createPlacement(p *placementv1.Placement) (*placementv1.Placement, error) {
	res, err := e.pl.CreatePlacement(context.Background(), connect.NewRequest(&placementv1.CreatePlacementRequest{Placement: p}))
	if err != nil {
		return nil, err
	}
	return res.Msg.Placement, nil
}

func (e *env) mustCreatePlacement(t testing.TB, p *placementv1.Placement) *placementv1.Placement {
	t.Helper()
	out, err := e.createPlacement(p)
	if err != nil {
		t.Fatalf("create placement %s/%s: %v", p.Project, p.Name, err)
	}
	return out
}

func (e *env) decisions(t testing.TB, project, name string) *placementv1.PlacementDecisions {
	t.Helper()
	res, err := e.pl.GetPlacementDecisions(context.Background(), connect.NewRequest(&placementv1.GetPlacementDecisionsRequest{Project: project, Name: name}))
	if err != nil {
		t.Fatalf("decisions of %s/%s: %v", project, name, err)
	}
	return res.Msg.Decisions
}

func decided(d *placementv1.PlacementDecisions) []string {
	var out []string
	for _, g := range d.GetGroups() {
		for _, p := range g.Pages {
			for _, c := range p.Clusters {
				out = append(out, c.ClusterName)
			}
		}
	}
	slices.Sort(out)
	return out
}

func condition(d *placementv1.PlacementDecisions, typ string) *placementv1.PlacementCondition {
	for _, c := range d.GetStatus().GetConditions() {
		if c.Type == typ {
			return c
		}
	}
	return nil
}

// eventuallyDecided waits until the placement's decision is exactly want (sorted).
func (e *env) eventuallyDecided(t testing.TB, project, name string, want ...string) *placementv1.PlacementDecisions {
	t.Helper()
	slices.Sort(want)
	var d *placementv1.PlacementDecisions
	testkit.Eventually(t, 10*time.Second, func() error {
		d = e.decisions(t, project, name)
		if got := decided(d); !slices.Equal(got, want) {
			return fmt.Errorf("placement %s/%s decided %v, want %v (status %v)", project, name, got, want, d.GetStatus())
		}
		return nil
	})
	return d
}

// scheduled waits until every view holds the events appended so far and the scheduler has made
// a whole round on them: a decision those inputs change has then been appended, so a decision
// (or a count of decision events) unchanged afterwards did not change, rather than not yet.
func (e *env) scheduled(t testing.TB) {
	t.Helper()
	testkit.WaitProjected(t, e.js.JS, append(clusterimport.Projections(), namespacebinding.Projections()...)...)
	if err := e.svc.WaitSchedulingRound(testkit.Context(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// connectAgents sends one heartbeat per cluster, as its agent would: until then cluster-import
// taints a cluster unreachable and placements skip it.
func (e *env) connectAgents(t testing.TB, clusters ...string) {
	t.Helper()
	ctx := testkit.Context(t, 10*time.Second)
	for _, c := range clusters {
		if _, err := events.NewStore(e.js.JS, "agent").Append(ctx, subjects.AgentHeartbeat(c), c, events.Any,
			&agentv1.Heartbeat{ClusterName: c, KubernetesVersion: "v1.34.4", Time: timestamppb.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitUntainted(t, 10*time.Second, clusters...)
}

// waitUntainted waits until cluster-import shows none of clusters tainted: their agents were
// heard from, so placements may select them.
func (e *env) waitUntainted(t testing.TB, d time.Duration, clusters ...string) {
	t.Helper()
	testkit.Eventually(t, d, func() error {
		for _, c := range clusters {
			res, err := e.clusters.GetCluster(context.Background(), connect.NewRequest(&clusterv1.GetClusterRequest{Name: c}))
			if err != nil {
				return err
			}
			if len(res.Msg.Cluster.Taints) > 0 {
				return fmt.Errorf("cluster %s still tainted %v", c, res.Msg.Cluster.Taints)
			}
		}
		return nil
	})
}

func (e *env) labelCluster(t testing.TB, cluster string, kv ...string) {
	t.Helper()
	e.setClusterLabels(t, cluster, hard(kv...))
}

func (e *env) taintCluster(t testing.TB, cluster string, taints ...*clusterv1.Taint) {
	t.Helper()
	if _, err := e.clusters.UpdateCluster(context.Background(), connect.NewRequest(&clusterv1.UpdateClusterRequest{
		Name: cluster, Taints: taints, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"taints"}}})); err != nil {
		t.Fatalf("taint cluster %s: %v", cluster, err)
	}
}

// decisionEvents reads every PlacementDecisionsChanged of a placement from the stream.
func (e *env) decisionEvents(t testing.TB, project, name string) []*placementv1.PlacementDecisionsChanged {
	t.Helper()
	ctx := testkit.Context(t, 10*time.Second)
	stream, err := e.js.JS.Stream(ctx, subjects.PlacementStream)
	if err != nil {
		t.Fatal(err)
	}
	c, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.PlacementDecision(project, name)}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subjects.PlacementDecision(project, name)))
	if err != nil {
		t.Fatal(err)
	}
	n := int(info.State.Subjects[subjects.PlacementDecision(project, name)])
	var out []*placementv1.PlacementDecisionsChanged
	for len(out) < n {
		msg, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("read decision events: %v", err)
		}
		ev, err := events.DecodeMsg(msg)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev.Payload.(*placementv1.PlacementDecisionsChanged))
	}
	return out
}

// fleet registers clusters c1..c4 (c1-c3 in eu, c4 in us), a project team-a with the global
// set bound.
func placementFleet(t *testing.T) *env {
	return placementFleetWith(t, namespacebinding.Config{ReleaseInterval: 100 * time.Millisecond})
}

func placementFleetWith(t *testing.T, cfg namespacebinding.Config) *env {
	e := start(t, nil, cfg)
	e.register(t, "c1", "c2", "c3", "c4")
	e.connectAgents(t, "c1", "c2", "c3", "c4")
	for _, c := range []string{"c1", "c2", "c3"} {
		e.labelCluster(t, c, "region", "eu")
	}
	e.labelCluster(t, "c4", "region", "us")
	e.createProject(t, "team-a")
	if _, err := e.bindSet("team-a", "global"); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestPlacementDecidesAndFollowsItsInputs(t *testing.T) {
	e := placementFleet(t)
	ctx := testkit.Context(t, 30*time.Second)
	p := e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "eu-2", NumberOfClusters: ptr[int32](2),
		Predicates: []*placementv1.Predicate{predicate("region", "eu")}})
	if p.Revision == 0 || p.CreateTime == nil {
		t.Fatalf("created placement lacks revision or time: %v", p)
	}
	// Ties break by name: c1 and c2.
	d := e.eventuallyDecided(t, "team-a", "eu-2", "c1", "c2")
	if c := condition(d, "PlacementSatisfied"); c == nil || c.Status != "True" || c.Reason != "AllDecisionsScheduled" {
		t.Fatalf("PlacementSatisfied = %v, want True/AllDecisionsScheduled", c)
	}
	if c := condition(d, "PlacementMisconfigured"); c == nil || c.Status != "False" {
		t.Fatalf("PlacementMisconfigured = %v, want False", c)
	}
	if got := d.Prioritizers; len(got) != 2 || got[0].Name != "Balance" || got[1].Name != "Steady" {
		t.Fatalf("prioritizers %v, want Additive's Balance and Steady", got)
	}
	for _, c := range d.Groups[0].Pages[0].Clusters {
		if len(c.Scores) != 2 {
			t.Fatalf("cluster %s has scores %v, want one per prioritizer", c.ClusterName, c.Scores)
		}
	}

	watch, err := e.pl.WatchPlacementDecisions(ctx, connect.NewRequest(&placementv1.WatchPlacementDecisionsRequest{Project: "team-a", Name: "eu-2"}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if !watch.Receive() {
		t.Fatalf("watch: %v", watch.Err())
	}
	if first := watch.Msg(); !slices.Equal(first.Added, []string{"c1", "c2"}) || len(first.Removed) != 0 {
		t.Fatalf("first watch message added %v removed %v, want every decided cluster added", first.Added, first.Removed)
	}

	// An input changes: c1 leaves eu. The decision replaces it with c3, and says so.
	e.labelCluster(t, "c1", "region", "us")
	e.eventuallyDecided(t, "team-a", "eu-2", "c2", "c3")
	for watch.Receive() {
		m := watch.Msg()
		if slices.Equal(decided(m.Decisions), []string{"c2", "c3"}) {
			if !slices.Equal(m.Added, []string{"c3"}) || !slices.Equal(m.Removed, []string{"c1"}) {
				t.Fatalf("watch added %v removed %v, want c3 added and c1 removed", m.Added, m.Removed)
			}
			break
		}
	}
	evs := e.decisionEvents(t, "team-a", "eu-2")
	last := evs[len(evs)-1]
	if !slices.Equal(last.Added, []string{"c3"}) || !slices.Equal(last.Removed, []string{"c1"}) {
		t.Fatalf("last PlacementDecisionsChanged added %v removed %v", last.Added, last.Removed)
	}

	// Nothing that selects clusters changes: no event adds or removes one, however often the
	// scheduler wakes. (The evaluation may still store new scores: c3, now kept, scores Steady.)
	n, _ := e.membershipEvents(t, "team-a", "eu-2")
	e.labelCluster(t, "c4", "region", "us", "tier", "gold") // c4 does not pass the predicate either way
	e.scheduled(t)
	if got, _ := e.membershipEvents(t, "team-a", "eu-2"); got != n {
		t.Fatalf("%d decision events adding or removing clusters after an irrelevant change, want still %d", got, n)
	}

	// Steady: c1 coming back to eu does not displace c2 or c3.
	e.labelCluster(t, "c1", "region", "eu")
	e.scheduled(t)
	if got := decided(e.decisions(t, "team-a", "eu-2")); !slices.Equal(got, []string{"c2", "c3"}) {
		t.Fatalf("decided %v once c1 is back in eu, want Steady to keep c2 and c3", got)
	}
	if got, _ := e.membershipEvents(t, "team-a", "eu-2"); got != n {
		t.Fatalf("%d decision events adding or removing clusters once c1 is back in eu, want still %d", got, n)
	}

	// A NoSelect taint drops a decided cluster; the placement picks the next one.
	e.taintCluster(t, "c2", &clusterv1.Taint{Key: "maintenance", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT})
	e.eventuallyDecided(t, "team-a", "eu-2", "c1", "c3")
}

func TestPlacementConditionsExplainAnEmptyDecision(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.connectAgents(t, "c1")
	e.createProject(t, "team-a")
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "all"})
	testkit.Eventually(t, 10*time.Second, func() error {
		c := condition(e.decisions(t, "team-a", "all"), "PlacementSatisfied")
		if c == nil || c.Status != "False" || c.Reason != "NoManagedClusterSetBindings" {
			return fmt.Errorf("PlacementSatisfied = %v, want False/NoManagedClusterSetBindings", c)
		}
		return nil
	})
	// Binding a set is an input: the placement is decided again.
	if _, err := e.bindSet("team-a", "default"); err != nil {
		t.Fatal(err)
	}
	e.eventuallyDecided(t, "team-a", "all", "c1")

	// A prioritizer this version does not know is stored, and reported as OCM reports it.
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "odd", PrioritizerPolicy: &placementv1.PrioritizerPolicy{
		Configurations: []*placementv1.PrioritizerConfig{{ScoreCoordinate: &placementv1.ScoreCoordinate{BuiltIn: "Nope"}}}}})
	testkit.Eventually(t, 10*time.Second, func() error {
		c := condition(e.decisions(t, "team-a", "odd"), "PlacementMisconfigured")
		if c == nil || c.Status != "True" || c.Field != "prioritizer_policy.configurations[0].score_coordinate.built_in" {
			return fmt.Errorf("PlacementMisconfigured = %v, want True naming the built_in field", c)
		}
		return nil
	})
	res, err := e.pl.GetPlacement(context.Background(), connect.NewRequest(&placementv1.GetPlacementRequest{Project: "team-a", Name: "odd"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Msg.Placement.GetStatus().GetConditions()) == 0 {
		t.Fatal("GetPlacement carries no status")
	}
}

func TestInvalidPlacementIsRefusedNamingTheField(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.createProject(t, "team-a")
	base := func(f func(p *placementv1.Placement)) *placementv1.Placement {
		p := &placementv1.Placement{Project: "team-a", Name: "p"}
		f(p)
		return p
	}
	for _, tc := range []struct {
		name  string
		p     *placementv1.Placement
		field string
	}{
		{"bad name", base(func(p *placementv1.Placement) { p.Name = "Not_A_Label" }), "placement.name"},
		{"negative count", base(func(p *placementv1.Placement) { p.NumberOfClusters = ptr[int32](-1) }), "placement.number_of_clusters"},
		{"bad selector operator", base(func(p *placementv1.Placement) {
			p.Predicates = []*placementv1.Predicate{{RequiredClusterSelector: &placementv1.ClusterSelector{LabelSelector: &placementv1.LabelSelector{
				MatchExpressions: []*placementv1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}}}}
		}), "placement.predicates[0].required_cluster_selector.label_selector"},
		{"bad claim selector", base(func(p *placementv1.Placement) {
			p.Predicates = []*placementv1.Predicate{{RequiredClusterSelector: &placementv1.ClusterSelector{ClaimSelector: &placementv1.ClaimSelector{
				MatchExpressions: []*placementv1.LabelSelectorRequirement{{Key: "a", Operator: "In"}}}}}}
		}), "placement.predicates[0].required_cluster_selector.claim_selector"},
		{"bad toleration operator", base(func(p *placementv1.Placement) {
			p.Tolerations = []*placementv1.Toleration{{Key: "k", Operator: "Like"}}
		}), "placement.tolerations[0].operator"},
		{"empty key without Exists", base(func(p *placementv1.Placement) { p.Tolerations = []*placementv1.Toleration{{}} }), "placement.tolerations[0].key"},
		{"Exists with a value", base(func(p *placementv1.Placement) {
			p.Tolerations = []*placementv1.Toleration{{Key: "k", Operator: "Exists", Value: "v"}}
		}), "placement.tolerations[0].value"},
		{"bad effect", base(func(p *placementv1.Placement) { p.Tolerations = []*placementv1.Toleration{{Key: "k", Effect: "NoWay"}} }), "placement.tolerations[0].effect"},
		{"bad mode", base(func(p *placementv1.Placement) { p.PrioritizerPolicy = &placementv1.PrioritizerPolicy{Mode: "Max"} }), "placement.prioritizer_policy.mode"},
		{"weight out of range", base(func(p *placementv1.Placement) {
			p.PrioritizerPolicy = &placementv1.PrioritizerPolicy{Configurations: []*placementv1.PrioritizerConfig{{
				ScoreCoordinate: &placementv1.ScoreCoordinate{BuiltIn: "Steady"}, Weight: ptr[int32](11)}}}
		}), "placement.prioritizer_policy.configurations[0].weight"},
		{"add-on without names", base(func(p *placementv1.Placement) {
			p.PrioritizerPolicy = &placementv1.PrioritizerPolicy{Configurations: []*placementv1.PrioritizerConfig{{
				ScoreCoordinate: &placementv1.ScoreCoordinate{Type: placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_ADD_ON}}}}
		}), "placement.prioritizer_policy.configurations[0].score_coordinate.add_on.resource_name"},
		{"bad group size", base(func(p *placementv1.Placement) {
			p.DecisionStrategy = &placementv1.DecisionStrategy{ClustersPerDecisionGroup: "150%"}
		}), "placement.decision_strategy.clusters_per_decision_group"},
		{"bad set name", base(func(p *placementv1.Placement) { p.ClusterSets = []string{"eu", "EU!"} }), "placement.cluster_sets[1]"},
		{"CEL syntax error", base(func(p *placementv1.Placement) {
			p.Predicates = []*placementv1.Predicate{predicate("region", "eu"), celPredicate(`true`, `managedCluster.metadata.labels["env"] ==`)}
		}), "placement.predicates[1].required_cluster_selector.cel_selector.cel_expressions[1]"},
		{"CEL over the cost limit", base(func(p *placementv1.Placement) {
			p.Predicates = []*placementv1.Predicate{celPredicate(
				`managedCluster.metadata.labels.all(a, managedCluster.metadata.labels.all(b, a != b || a == b))`)}
		}), "placement.predicates[0].required_cluster_selector.cel_selector.cel_expressions[0]"},
		{"bad group name", base(func(p *placementv1.Placement) {
			p.DecisionStrategy = &placementv1.DecisionStrategy{Groups: []*placementv1.DecisionGroup{{GroupName: "-canary"}}}
		}), "placement.decision_strategy.groups[0].group_name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.createPlacement(tc.p)
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("create: %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	res, err := e.pl.ListPlacements(context.Background(), connect.NewRequest(&placementv1.ListPlacementsRequest{Project: "team-a"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Msg.Placements) != 0 {
		t.Fatalf("refused placements were stored: %v", res.Msg.Placements)
	}
	if _, err := e.createPlacement(&placementv1.Placement{Project: "nope", Name: "p"}); code(err) != connect.CodeNotFound {
		t.Fatalf("placement in a missing project: %v, want NotFound", err)
	}
}

// celPredicate matches clusters for which every CEL expression is true.
func celPredicate(exprs ...string) *placementv1.Predicate {
	return &placementv1.Predicate{RequiredClusterSelector: &placementv1.ClusterSelector{
		CelSelector: &placementv1.CelSelector{CelExpressions: exprs}}}
}

// TestCELPlacementDecidesThroughTheAPI: a placement with OCM's celSelector is stored, decided
// by its expressions (labels, name, the agents' reported Kubernetes version through semver)
// and decided again when a label it reads changes; a bad expression is refused (above).
func TestCELPlacementDecidesThroughTheAPI(t *testing.T) {
	e := placementFleet(t)
	p := e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "cel", Predicates: []*placementv1.Predicate{
		celPredicate(`managedCluster.metadata.labels["region"] == "eu" && managedCluster.metadata.name != "c2"`,
			`semver(managedCluster.status.version.kubernetes, true).isGreaterThan(semver("1.30.0"))`)}})
	if got := p.Predicates[0].GetRequiredClusterSelector().GetCelSelector().GetCelExpressions(); len(got) != 2 {
		t.Fatalf("stored expressions %v, want both", got)
	}
	d := e.eventuallyDecided(t, "team-a", "cel", "c1", "c3")
	if c := condition(d, "PlacementMisconfigured"); c == nil || c.Status != "False" {
		t.Fatalf("PlacementMisconfigured = %v, want False", c)
	}
	e.labelCluster(t, "c3", "region", "us")
	e.eventuallyDecided(t, "team-a", "cel", "c1")

	// The version every agent here reports (v1.34.4) is not below 1.30.
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "old", Predicates: []*placementv1.Predicate{
		celPredicate(`semver(managedCluster.status.version.kubernetes, true).isLessThan(semver("1.30.0"))`)}})
	testkit.Eventually(t, 10*time.Second, func() error {
		d := e.decisions(t, "team-a", "old")
		if c := condition(d, "PlacementSatisfied"); c == nil || c.Reason != "NoManagedClusterMatched" || len(decided(d)) != 0 {
			return fmt.Errorf("decided %v, PlacementSatisfied = %v, want nothing and NoManagedClusterMatched", decided(d), c)
		}
		return nil
	})
}

func TestTolerationSecondsRunOutOnATimer(t *testing.T) {
	e := placementFleet(t)
	e.taintCluster(t, "c1", &clusterv1.Taint{Key: "maintenance", Effect: clusterv1.TaintEffect_TAINT_EFFECT_NO_SELECT,
		TimeAdded: timestamppb.Now()})
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "eu", Predicates: []*placementv1.Predicate{predicate("region", "eu")},
		Tolerations: []*placementv1.Toleration{{Key: "maintenance", Operator: "Exists", TolerationSeconds: ptr[int64](2)}}})
	e.eventuallyDecided(t, "team-a", "eu", "c1", "c2", "c3")
	start := time.Now()
	// Nothing else changes: only the scheduler's timer can drop c1.
	e.eventuallyDecided(t, "team-a", "eu", "c2", "c3")
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("c1 dropped %v after its toleration ran out, want about 2 s", waited)
	}
}

func TestAddOnScoresRankClustersAndExpire(t *testing.T) {
	e := placementFleet(t)
	ctx := context.Background()
	set := func(cluster string, score int32, validUntil *timestamppb.Timestamp) {
		t.Helper()
		if _, err := e.pl.SetAddOnScore(ctx, connect.NewRequest(&placementv1.SetAddOnScoreRequest{Cluster: cluster, ResourceName: "cost",
			ScoreName: "cheap", Score: score, ValidUntil: validUntil})); err != nil {
			t.Fatalf("set score of %s: %v", cluster, err)
		}
	}
	set("c3", 90, nil)
	set("c2", 50, nil)
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "cheap", NumberOfClusters: ptr[int32](1),
		Predicates: []*placementv1.Predicate{predicate("region", "eu")},
		PrioritizerPolicy: &placementv1.PrioritizerPolicy{Mode: "Exact", Configurations: []*placementv1.PrioritizerConfig{{
			ScoreCoordinate: &placementv1.ScoreCoordinate{Type: placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_ADD_ON,
				AddOn: &placementv1.AddOnScoreCoordinate{ResourceName: "cost", ScoreName: "cheap"}}, Weight: ptr[int32](2)}}}})
	d := e.eventuallyDecided(t, "team-a", "cheap", "c3")
	if got := d.Groups[0].Pages[0].Clusters[0]; got.Total != 180 || !slices.Equal(got.Scores, []int64{90}) {
		t.Fatalf("c3 scored %v total %d, want score 90 weighted 2", got.Scores, got.Total)
	}
	// A score that expires counts as absent: c2's 50 wins once c3's 90 has run out.
	set("c3", 90, timestamppb.New(time.Now().Add(1500*time.Millisecond)))
	e.eventuallyDecided(t, "team-a", "cheap", "c2")

	for _, tc := range []struct {
		req   *placementv1.SetAddOnScoreRequest
		field string
		code  connect.Code
	}{
		{&placementv1.SetAddOnScoreRequest{Cluster: "c1", ResourceName: "cost", ScoreName: "x", Score: 101}, "score", connect.CodeInvalidArgument},
		{&placementv1.SetAddOnScoreRequest{Cluster: "c1", ScoreName: "x"}, "resource_name", connect.CodeInvalidArgument},
		{&placementv1.SetAddOnScoreRequest{Cluster: "nope", ResourceName: "cost", ScoreName: "x"}, "nope", connect.CodeNotFound},
	} {
		if _, err := e.pl.SetAddOnScore(ctx, connect.NewRequest(tc.req)); code(err) != tc.code || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("SetAddOnScore(%v): %v, want %v naming %s", tc.req, err, tc.code, tc.field)
		}
	}
}

func (e *env) bindToPlacement(project, namespace, placement string, hard map[string]string) (*projectv1.BindNamespaceResponse, error) {
	res, err := e.client.BindNamespace(context.Background(), connect.NewRequest(&projectv1.BindNamespaceRequest{
		Project: project, Namespace: namespace, Placement: placement, Hard: hard}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func (e *env) projectBindings(t testing.TB, project string) []*projectv1.NamespaceBinding {
	t.Helper()
	res, err := e.client.ListNamespaceBindings(context.Background(), connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: project}))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg.Bindings
}

// bindingsOf summarises a project's bindings of namespace as "cluster:phase:placement".
func (e *env) bindingsOf(t testing.TB, project, namespace string) []string {
	var out []string
	for _, b := range e.projectBindings(t, project) {
		if b.Namespace == namespace {
			out = append(out, fmt.Sprintf("%s:%s:%s", b.Cluster, strings.TrimPrefix(b.Phase.String(), "BINDING_PHASE_"), b.Placement))
		}
	}
	slices.Sort(out)
	return out
}

func TestNamespaceFollowsItsPlacement(t *testing.T) {
	e := placementFleet(t)
	e.createProject(t, "team-b")
	// team-b already owns web on c3.
	e.mustBind(t, "team-b", "c3", "web", nil)
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "eu-2", NumberOfClusters: ptr[int32](2),
		Predicates: []*placementv1.Predicate{predicate("region", "eu")}})
	e.eventuallyDecided(t, "team-a", "eu-2", "c1", "c2")

	res, err := e.bindToPlacement("team-a", "web", "eu-2", hard("cpu", "2"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.PlacementBindings) != 2 {
		t.Fatalf("bind to placement answered %v, want the bindings on c1 and c2", res.PlacementBindings)
	}
	for _, b := range res.PlacementBindings {
		if b.Placement != "eu-2" || b.Hard["cpu"] != "2" {
			t.Fatalf("binding %v: want placement eu-2 and the quota", b)
		}
	}
	// A manual binding of another namespace on c1 stays whatever the placement does.
	e.mustBind(t, "team-a", "c1", "tools", nil)

	// c1 leaves eu: web moves to c3, where team-b owns it: Failed, naming team-b. c1's
	// binding is released (Terminating: its agent has not confirmed).
	e.labelCluster(t, "c1", "region", "us")
	e.eventuallyDecided(t, "team-a", "eu-2", "c2", "c3")
	testkit.Eventually(t, 10*time.Second, func() error {
		got := e.bindingsOf(t, "team-a", "web")
		want := []string{"c1:TERMINATING:eu-2", "c2:PENDING:eu-2", "c3:FAILED:eu-2"}
		if !slices.Equal(got, want) {
			return fmt.Errorf("web bindings %v, want %v", got, want)
		}
		return nil
	})
	for _, b := range e.projectBindings(t, "team-a") {
		if b.Cluster == "c3" && b.Namespace == "web" && (b.Reason != namespacebinding.ReasonOwnedByOtherProject || !strings.Contains(b.Message, "team-b")) {
			t.Fatalf("c3's binding %v: want OwnedByOtherProject naming team-b", b)
		}
	}
	if _, ok := e.binding(t, "team-a", "c1", "tools"); !ok {
		t.Fatal("the manual binding of tools on c1 was touched")
	}
	// team-b lets go of web on c3 (its agent confirms): team-a's binding follows.
	if _, err := e.client.UnbindNamespace(context.Background(), connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-b", Cluster: "c3", Namespace: "web"})); err != nil {
		t.Fatal(err)
	}
	e.desiredObject(t, nsKey("c3", "web"), func(o *desiredv1.DesiredObject) bool { return o.Tombstone })
	e.agentReports(t, nsKey("c3", "web"), nil) // its agent applied the tombstone
	testkit.Eventually(t, 15*time.Second, func() error {
		got := e.bindingsOf(t, "team-a", "web")
		if !slices.Contains(got, "c3:PENDING:eu-2") {
			return fmt.Errorf("web bindings %v, want c3 bound to team-a once team-b released it", got)
		}
		return nil
	})

	// A placement that namespaces follow cannot be deleted.
	if _, err := e.pl.DeletePlacement(context.Background(), connect.NewRequest(&placementv1.DeletePlacementRequest{Project: "team-a", Name: "eu-2"})); code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "web") {
		t.Fatalf("delete followed placement: %v, want FailedPrecondition naming web", err)
	}
	// Unbinding from the placement releases every cluster.
	if _, err := e.client.UnbindNamespace(context.Background(), connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Namespace: "web", Placement: "eu-2"})); err != nil {
		t.Fatal(err)
	}
	for _, b := range e.projectBindings(t, "team-a") {
		if b.Namespace == "web" && b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
			t.Fatalf("after unbind from the placement: %v", b)
		}
	}
	if _, err := e.pl.DeletePlacement(context.Background(), connect.NewRequest(&placementv1.DeletePlacementRequest{Project: "team-a", Name: "eu-2"})); err != nil {
		t.Fatal(err)
	}
	// The deleted placement's last event removes every cluster.
	testkit.Eventually(t, 10*time.Second, func() error {
		evs := e.decisionEvents(t, "team-a", "eu-2")
		last := evs[len(evs)-1]
		if last.Decisions != nil || !slices.Equal(last.Removed, []string{"c2", "c3"}) {
			return fmt.Errorf("last decision event %v, want no decisions and c2, c3 removed", last)
		}
		return nil
	})
}

func TestDecisionsSurviveARestartUnchanged(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, namespacebinding.Config{})
	e.register(t, "c1", "c2", "c3")
	e.connectAgents(t, "c1", "c2", "c3")
	e.labelCluster(t, "c1", "only", "yes")
	e.createProject(t, "team-a")
	if _, err := e.bindSet("team-a", "global"); err != nil {
		t.Fatal(err)
	}
	// one picks c1 while nobody else decided anything; then two placements that can only
	// have c1 decide it. Decided again today, Balance would move one to c2 (c1: Steady 100 +
	// Balance -100 = 0 < c2: 100); but none of its inputs changed, so it must stay.
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "one", NumberOfClusters: ptr[int32](1)})
	e.eventuallyDecided(t, "team-a", "one", "c1")
	for _, n := range []string{"only-a", "only-b"} {
		e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: n, Predicates: []*placementv1.Predicate{predicate("only", "yes")}})
		e.eventuallyDecided(t, "team-a", n, "c1")
	}
	before := e.decisions(t, "team-a", "one")
	n := len(e.decisionEvents(t, "team-a", "one"))
	e.stop()

	e = start(t, j, namespacebinding.Config{})
	e.scheduled(t) // the new process's first scheduling round
	after := e.decisions(t, "team-a", "one")
	if !proto.Equal(before, after) {
		t.Fatalf("decision after restart %v, want unchanged %v", after, before)
	}
	if got := len(e.decisionEvents(t, "team-a", "one")); got != n {
		t.Fatalf("%d decision events after a restart, want still %d", got, n)
	}
}

func TestPlacementsGuardTheirProjectAndTheirBindings(t *testing.T) {
	e := placementFleet(t)
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "eu", Predicates: []*placementv1.Predicate{predicate("region", "eu")}})
	e.eventuallyDecided(t, "team-a", "eu", "c1", "c2", "c3")
	if _, err := e.bindToPlacement("team-a", "web", "eu", nil); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A placement's binding is the follower's: changing it by hand would be undone at once.
	if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web"})); code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "placement") {
		t.Fatalf("unbind a placement's binding by hand: %v, want FailedPrecondition naming the placement", err)
	}
	if _, err := e.client.UpdateQuota(ctx, connect.NewRequest(&projectv1.UpdateQuotaRequest{Project: "team-a", Cluster: "c1", Namespace: "web", Hard: hard("cpu", "1")})); code(err) != connect.CodeFailedPrecondition {
		t.Fatalf("update a placement's quota by hand: %v, want FailedPrecondition", err)
	}
	// A project with placements is not deleted from under them, even with force.
	if _, err := e.client.DeleteProject(ctx, connect.NewRequest(&projectv1.DeleteProjectRequest{Name: "team-a", Force: true})); code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "placement") {
		t.Fatalf("delete a project with placements: %v, want FailedPrecondition", err)
	}
	// Binding the namespace again with limits changes every cluster's quota.
	if _, err := e.bindToPlacement("team-a", "web", "eu", hard("cpu", "3")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, c := range []string{"c1", "c2", "c3"} {
			b, ok := e.binding(t, "team-a", c, "web")
			if !ok || b.Hard["cpu"] != "3" {
				return fmt.Errorf("web on %s: %v", c, b)
			}
		}
		return nil
	})
}

func TestBudgetThatDoesNotFitShowsAsAFailedPlacementBinding(t *testing.T) {
	e := placementFleet(t)
	// On c2 team-a may hand out 1 CPU; web asks 2 on every cluster.
	e.mustSetBudget(t, "team-a", "c2", hard("cpu", "1"))
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "eu", Predicates: []*placementv1.Predicate{predicate("region", "eu")}})
	e.eventuallyDecided(t, "team-a", "eu", "c1", "c2", "c3")
	if _, err := e.bindToPlacement("team-a", "web", "eu", hard("cpu", "2")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if got, want := e.bindingsOf(t, "team-a", "web"), []string{"c1:PENDING:eu", "c2:FAILED:eu", "c3:PENDING:eu"}; !slices.Equal(got, want) {
			return fmt.Errorf("web bindings %v, want %v", got, want)
		}
		return nil
	})
	for _, b := range e.projectBindings(t, "team-a") {
		if b.Cluster == "c2" && (b.Reason != namespacebinding.ReasonOverBudget || !strings.Contains(b.Message, "cpu asks 2, 1 left of 1")) {
			t.Fatalf("c2's binding %v: want OverBudget saying what is asked and left", b)
		}
	}
	// The budget grows: the follower binds c2 on its next try.
	e.mustSetBudget(t, "team-a", "c2", hard("cpu", "4"))
	testkit.Eventually(t, 15*time.Second, func() error {
		if got := e.bindingsOf(t, "team-a", "web"); !slices.Contains(got, "c2:PENDING:eu") {
			return fmt.Errorf("web bindings %v, want c2 bound once the budget fits", got)
		}
		return nil
	})
}
