package namespacebinding_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fleetstream/fleetstream/pkg/events"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

func (e *env) setBudget(project, cluster string, hard map[string]string) (*projectv1.Project, error) {
	res, err := e.client.SetProjectBudget(context.Background(), connect.NewRequest(&projectv1.SetProjectBudgetRequest{
		Project: project, Cluster: cluster, Hard: hard}))
	if err != nil {
		return nil, err
	}
	return res.Msg.Project, nil
}

func (e *env) mustSetBudget(t testing.TB, project, cluster string, hard map[string]string) *projectv1.Project {
	t.Helper()
	p, err := e.setBudget(project, cluster, hard)
	if err != nil {
		t.Fatalf("budget of %s on %s: %v", project, cluster, err)
	}
	return p
}

func (e *env) updateQuota(project, cluster, namespace string, hard map[string]string) error {
	_, err := e.client.UpdateQuota(context.Background(), connect.NewRequest(&projectv1.UpdateQuotaRequest{
		Project: project, Cluster: cluster, Namespace: namespace, Hard: hard}))
	return err
}

func (e *env) unbindNS(t testing.TB, project, cluster, namespace string) {
	t.Helper()
	if _, err := e.client.UnbindNamespace(context.Background(), connect.NewRequest(&projectv1.UnbindNamespaceRequest{
		Project: project, Cluster: cluster, Namespace: namespace})); err != nil {
		t.Fatalf("unbind %s/%s: %v", cluster, namespace, err)
	}
}

// budget returns the project's budget on cluster as presented (nil: none).
func budget(p *projectv1.Project, cluster string) *projectv1.ProjectBudget {
	for _, b := range p.GetBudgets() {
		if b.Cluster == cluster {
			return b
		}
	}
	return nil
}

func hard(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func TestSetProjectBudgetValidatesAtTheEdge(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.createProject(t, "team-a")
	cases := []struct {
		name    string
		project string
		cluster string
		hard    map[string]string
		code    connect.Code
		want    string
	}{
		{"empty project", "", "c1", hard("cpu", "1"), connect.CodeInvalidArgument, "project:"},
		{"upper-case project", "Team-A", "c1", hard("cpu", "1"), connect.CodeInvalidArgument, "project:"},
		{"dotted cluster", "team-a", "c.1", hard("cpu", "1"), connect.CodeInvalidArgument, "cluster:"},
		{"negative cpu", "team-a", "c1", hard("cpu", "-1"), connect.CodeInvalidArgument, `hard["cpu"]:`},
		{"unparsable memory", "team-a", "c1", hard("cpu", "1", "memory", "20 GB"), connect.CodeInvalidArgument, `hard["memory"]:`},
		{"bad resource name", "team-a", "c1", hard("cpu!", "1"), connect.CodeInvalidArgument, `hard["cpu!"]:`},
		{"unknown project", "team-z", "c1", hard("cpu", "1"), connect.CodeNotFound, `project "team-z"`},
		{"unknown cluster", "team-a", "c9", hard("cpu", "1"), connect.CodeNotFound, `cluster "c9"`},
		// Removing a budget that is not there changes nothing, on any cluster.
		{"remove an absent budget", "team-a", "c9", nil, connect.Code(0), ""},
		{"valid", "team-a", "c1", hard("cpu", "10", "memory", "20Gi", "requests.storage", "1Ti"), connect.Code(0), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.setBudget(tc.project, tc.cluster, tc.hard)
			if tc.code == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %v naming %s", err, tc.code, tc.want)
			}
		})
	}
	p := e.project(t, "team-a")
	if len(p.Budgets) != 1 || !proto.Equal(p.Budgets[0], &projectv1.ProjectBudget{Cluster: "c1",
		Hard: hard("cpu", "10", "memory", "20Gi", "requests.storage", "1Ti"), Allocated: hard("cpu", "0", "memory", "0", "requests.storage", "0")}) {
		t.Fatalf("budgets after the invalid requests and one valid one: %v", p.Budgets)
	}
}

// Binds and quota updates fit in the budget or are refused naming the resource, the amount
// asked and the amount left; unbinding frees budget; a budget on c1 does not limit c2.
func TestBudgetLimitsBindsAndQuotaUpdates(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a", "team-b")
	p := e.mustSetBudget(t, "team-a", "c1", hard("cpu", "10", "memory", "20Gi"))
	if b := budget(p, "c1"); b == nil || b.Hard["cpu"] != "10" || b.Allocated["cpu"] != "0" {
		t.Fatalf("answer of SetProjectBudget: %v", p.Budgets)
	}

	type step struct {
		name string
		do   func() error
		code connect.Code // 0: succeeds
		want string
	}
	bind := func(project, cluster, ns string, h map[string]string) func() error {
		return func() error { _, err := e.bind(project, cluster, ns, h); return err }
	}
	update := func(ns string, h map[string]string) func() error {
		return func() error { return e.updateQuota("team-a", "c1", ns, h) }
	}
	fp := connect.CodeFailedPrecondition
	steps := []step{
		{"first namespace fits", bind("team-a", "c1", "web", hard("cpu", "4", "memory", "8Gi")), 0, ""},
		{"second namespace fits", bind("team-a", "c1", "api", hard("cpu", "4", "memory", "8Gi", "pods", "100")), 0, ""},
		{"cpu beyond what is left", bind("team-a", "c1", "db", hard("cpu", "4", "memory", "1Gi")), fp,
			"project team-a budget on cluster c1: cpu asks 4, 2 left of 10"},
		{"both resources beyond", bind("team-a", "c1", "db", hard("cpu", "3", "memory", "5Gi")), fp,
			"cpu asks 3, 2 left of 10; memory asks 5Gi, 4Gi left of 20Gi"},
		{"a budgeted resource without a limit", bind("team-a", "c1", "db", hard("cpu", "1")), fp,
			"the quota of namespace db must set memory too"},
		{"no quota at all", bind("team-a", "c1", "db", nil), fp, "must set cpu, memory too"},
		{"exactly what is left", bind("team-a", "c1", "db", hard("cpu", "2", "memory", "4Gi")), 0, ""},
		{"unbudgeted resources are free", update("db", hard("cpu", "2", "memory", "4Gi", "pods", "1000")), 0, ""},
		// The namespace's own share counts as left: web holds 4 of the 10.
		{"update beyond", update("web", hard("cpu", "5", "memory", "8Gi")), fp, "cpu asks 5, 4 left of 10"},
		{"update removing a budgeted limit", update("web", hard("cpu", "4")), fp, "must set memory too"},
		{"update removing the quota", update("web", nil), fp, "must set cpu, memory too"},
		{"update lowering", update("web", hard("cpu", "1", "memory", "8Gi")), 0, ""},
		{"update within", update("web", hard("cpu", "4", "memory", "8Gi")), 0, ""},
		{"another cluster is unlimited", bind("team-a", "c2", "web", hard("cpu", "100")), 0, ""},
		{"another project is unlimited", bind("team-b", "c1", "big", hard("cpu", "100")), 0, ""},
		{"the budget cannot go below what is held", func() error { _, err := e.setBudget("team-a", "c1", hard("cpu", "8", "memory", "20Gi")); return err },
			fp, "project team-a budget on cluster c1: cpu 8 is below the 10 its namespaces hold"},
		{"a budget on c2 needs a limit in every namespace there", func() error { _, err := e.setBudget("team-a", "c2", hard("cpu", "200", "memory", "1Ti")); return err },
			fp, "namespaces without a limit for a budgeted resource: web (memory)"},
	}
	for _, st := range steps {
		err := st.do()
		switch {
		case st.code == 0 && err != nil:
			t.Fatalf("%s: %v", st.name, err)
		case st.code != 0 && (code(err) != st.code || !strings.Contains(err.Error(), st.want)):
			t.Fatalf("%s: got %v, want %v with %q", st.name, err, st.code, st.want)
		}
	}
	p = e.project(t, "team-a")
	if b := budget(p, "c1"); b == nil || !proto.Equal(b, &projectv1.ProjectBudget{Cluster: "c1", Hard: hard("cpu", "10", "memory", "20Gi"), Allocated: hard("cpu", "10", "memory", "20Gi")}) {
		t.Fatalf("budget of c1 when full: %v", p.Budgets)
	}
	if budget(p, "c2") != nil {
		t.Fatalf("a refused budget was recorded: %v", p.Budgets)
	}
	// Nothing refused was half-written: a refused bind leaves no claim behind.
	ks, err := e.kv(t, namespacebinding.ClaimsBucket).ListKeys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var claims []string
	for k := range ks.Keys() {
		claims = append(claims, k)
	}
	if len(claims) != 5 { // team-a: c1/web, c1/api, c1/db, c2/web; team-b: c1/big
		t.Fatalf("claims after refused binds: %v", claims)
	}

	// Unbinding frees its share at once (Terminating bindings no longer count).
	e.unbindNS(t, "team-a", "c1", "api")
	if b := budget(e.project(t, "team-a"), "c1"); b.Allocated["cpu"] != "6" || b.Allocated["memory"] != "12Gi" {
		t.Fatalf("after unbinding api: %v", b)
	}
	if err := bind("team-a", "c1", "cache", hard("cpu", "4", "memory", "8Gi"))(); err != nil {
		t.Fatalf("bind into the freed budget: %v", err)
	}
	if err := bind("team-a", "c1", "more", hard("cpu", "1", "memory", "1"))(); code(err) != fp || !strings.Contains(err.Error(), "cpu asks 1, 0 left of 10") {
		t.Fatalf("bind into a full budget: %v", err)
	}
	// Raising and removing the budget.
	e.mustSetBudget(t, "team-a", "c1", hard("cpu", "11", "memory", "20Gi"))
	if err := bind("team-a", "c1", "more", hard("cpu", "1", "memory", "0"))(); err != nil {
		t.Fatalf("bind after raising the budget: %v", err)
	}
	p = e.mustSetBudget(t, "team-a", "c1", nil)
	if len(p.Budgets) != 0 {
		t.Fatalf("budgets after removal: %v", p.Budgets)
	}
	if err := bind("team-a", "c1", "unlimited", nil)(); err != nil {
		t.Fatalf("bind without a budget: %v", err)
	}
}

// Concurrent binds of one project, through two replicas of the service sharing the stream,
// never hand out more than the budget: the check and the append are one decision on one
// revision of the project, which the stream enforces.
func TestConcurrentBindsNeverOverspendTheBudget(t *testing.T) {
	j := testkit.StartJetStream(t)
	e1 := start(t, j, namespacebinding.Config{})
	e2 := start(t, j, namespacebinding.Config{})
	replicas := []*env{e1, e2}
	e1.register(t, "c1", "c2")

	cases := []struct {
		name    string
		project string
		cluster string
		budget  string
		asks    []string // cpu of each bind
		// setBudgetDuring sets the budget while the binds run instead of before.
		setBudgetDuring bool
	}{
		{name: "equal shares", project: "equal", cluster: "c1", budget: "10", asks: repeat("1", 24)},
		{name: "mixed shares", project: "mixed", cluster: "c1", budget: "10", asks: append(repeat("3", 8), append(repeat("2", 8), repeat("500m", 8)...)...)},
		// Binds queue on each replica's project lock behind the budget; those after it must
		// see it although the projects view may not show it yet.
		{name: "budget set while binding", project: "racing", cluster: "c2", budget: "30", asks: repeat("1", 64), setBudgetDuring: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e1.createProject(t, tc.project)
			limit := resource.MustParse(tc.budget)
			if !tc.setBudgetDuring {
				e1.mustSetBudget(t, tc.project, tc.cluster, hard("cpu", tc.budget))
			}
			errs := make([]error, len(tc.asks))
			var budgetErr error
			var wg sync.WaitGroup
			startGate := make(chan struct{})
			for i, ask := range tc.asks {
				wg.Go(func() {
					<-startGate
					_, errs[i] = replicas[i%2].bind(tc.project, tc.cluster, fmt.Sprintf("%s-%02d", tc.project, i), hard("cpu", ask))
				})
			}
			if tc.setBudgetDuring {
				wg.Go(func() {
					<-startGate
					// Some binds are appended before the budget, the rest are in flight on
					// both replicas when it lands (or it is refused: they hold too much).
					// The sleep only staggers the race; the test holds for every interleaving.
					time.Sleep(time.Millisecond)
					_, budgetErr = e2.setBudget(tc.project, tc.cluster, hard("cpu", tc.budget))
				})
			}
			close(startGate)
			wg.Wait()

			var granted resource.Quantity
			ok := 0
			for i, err := range errs {
				switch {
				case err == nil:
					granted.Add(resource.MustParse(tc.asks[i]))
					ok++
				case code(err) == connect.CodeFailedPrecondition && strings.Contains(err.Error(), "left of "+tc.budget):
				default:
					t.Errorf("bind %d (cpu %s): %v", i, tc.asks[i], err)
				}
			}
			budgetHolds := !tc.setBudgetDuring || budgetErr == nil
			if tc.setBudgetDuring && budgetErr != nil && code(budgetErr) != connect.CodeFailedPrecondition {
				t.Fatalf("set budget: %v", budgetErr)
			}
			if budgetHolds {
				if granted.Cmp(limit) > 0 {
					t.Fatalf("granted cpu %s of a budget of %s", granted.String(), tc.budget)
				}
				// Exactly those that fit succeed: grants only grow here, so a refused bind
				// does not fit in what is granted in the end either.
				for i, err := range errs {
					if err == nil {
						continue
					}
					total := granted.DeepCopy()
					total.Add(resource.MustParse(tc.asks[i]))
					if total.Cmp(limit) <= 0 {
						t.Errorf("bind %d (cpu %s) was refused, yet fits in what is granted (%s of %s): %v", i, tc.asks[i], granted.String(), tc.budget, errs[i])
					}
				}
			} else if !strings.Contains(budgetErr.Error(), "its namespaces hold") {
				t.Fatalf("budget %s refused with %d cpu granted: %v", tc.budget, ok, budgetErr)
			}
			if tc.name == "equal shares" && ok != 10 {
				t.Fatalf("%d of %d binds of cpu 1 succeeded against a budget of 10", ok, len(tc.asks))
			}
			// Both replicas show what the stream holds: the bindings and the allocation.
			for r, e := range replicas {
				testkit.Eventually(t, 10*time.Second, func() error {
					res, err := e.client.ListNamespaceBindings(context.Background(), connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: tc.project}))
					if err != nil {
						return err
					}
					if len(res.Msg.Bindings) != ok {
						return fmt.Errorf("replica %d lists %d bindings, %d succeeded", r, len(res.Msg.Bindings), ok)
					}
					p := e.project(t, tc.project)
					b := budget(p, tc.cluster)
					switch {
					case budgetHolds && b == nil:
						return fmt.Errorf("replica %d: no budget: %v", r, p)
					case budgetHolds && b.Allocated["cpu"] != granted.String():
						return fmt.Errorf("replica %d: allocated %s, granted %s", r, b.Allocated["cpu"], granted.String())
					}
					return nil
				})
			}
		})
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// The budgets are part of the projects view, a projection: restarting the service, even with
// the view's bucket lost, rebuilds the same projects, and the budget still binds.
func TestBudgetsSurviveRestartAndRebuild(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a")
	e.mustSetBudget(t, "team-a", "c1", hard("cpu", "4", "memory", "8Gi"))
	e.mustSetBudget(t, "team-a", "c2", hard("pods", "10"))
	e.mustSetBudget(t, "team-a", "c2", hard("pods", "20")) // replaced, not added
	e.mustBind(t, "team-a", "c1", "web", hard("cpu", "3", "memory", "2Gi"))
	// A bind answers once the bindings view has it; the projects view applies the same event
	// on its own schedule. Compare with the project once it has.
	stream, err := j.JS.Stream(context.Background(), namespacebinding.Stream)
	if err != nil {
		t.Fatal(err)
	}
	last, err := events.LastSequence(context.Background(), stream, "fleet.ns.project.team-a")
	if err != nil {
		t.Fatal(err)
	}
	var before *projectv1.Project
	testkit.Eventually(t, 10*time.Second, func() error {
		if before = e.project(t, "team-a"); before.Revision < last {
			return fmt.Errorf("project at revision %d, the stream at %d", before.Revision, last)
		}
		return nil
	})
	want := []*projectv1.ProjectBudget{
		{Cluster: "c1", Hard: hard("cpu", "4", "memory", "8Gi"), Allocated: hard("cpu", "3", "memory", "2Gi")},
		{Cluster: "c2", Hard: hard("pods", "20"), Allocated: hard("pods", "0")},
	}
	if len(before.Budgets) != len(want) || !proto.Equal(before.Budgets[0], want[0]) || !proto.Equal(before.Budgets[1], want[1]) {
		t.Fatalf("budgets %v, want %v", before.Budgets, want)
	}
	e.stop()

	for _, tc := range []struct {
		name       string
		dropBucket bool
	}{{"restart", false}, {"rebuild from the stream", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.dropBucket {
				if err := j.JS.DeleteKeyValue(context.Background(), namespacebinding.ProjectsBucket); err != nil {
					t.Fatal(err)
				}
			}
			e2 := start(t, j, namespacebinding.Config{})
			defer e2.stop()
			after := e2.project(t, "team-a")
			if !proto.Equal(before, after) {
				t.Fatalf("after %s:\n%v\nwant\n%v", tc.name, after, before)
			}
			if _, err := e2.bind("team-a", "c1", "api", hard("cpu", "2", "memory", "1Gi")); code(err) != connect.CodeFailedPrecondition ||
				!strings.Contains(err.Error(), "cpu asks 2, 1 left of 4") {
				t.Fatalf("bind beyond the budget after %s: %v", tc.name, err)
			}
		})
	}
}

// A bind queued on the project lock behind the project's deletion must not land on the deleted
// project: the lock's state knows the project is gone before the projects view does.
func TestNoBindLandsOnADeletedProject(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	for round := range 5 {
		project := fmt.Sprintf("doomed-%d", round)
		e.createProject(t, project)
		var wg sync.WaitGroup
		var delErr error
		gate := make(chan struct{})
		for i := range 16 {
			wg.Go(func() {
				<-gate
				_, _ = e.bind(project, "c1", fmt.Sprintf("%s-%02d", project, i), nil)
			})
		}
		wg.Go(func() {
			<-gate
			_, delErr = e.client.DeleteProject(context.Background(), connect.NewRequest(&projectv1.DeleteProjectRequest{Name: project, Force: true}))
		})
		close(gate)
		wg.Wait()
		if delErr != nil {
			t.Fatalf("force delete of %s: %v", project, delErr)
		}
		res, err := e.client.ListNamespaceBindings(context.Background(), connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Cluster: "c1"}))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range res.Msg.Bindings {
			if b.Project == project && b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
				t.Fatalf("binding %s/%s of deleted project %s is %v", b.Cluster, b.Namespace, project, b.Phase)
			}
		}
	}
}
