package cli

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

// hubEnv runs the real cluster registry and project service, and any extra services a test
// adds, on one JetStream behind one authenticated server, as fleetd does.
type hubEnv struct {
	*e2eEnv
	js *testkit.JetStream
}

// Bearer tokens of the hub's token file: alice (e2eToken) and bob.
const bobToken = "e2e-bob-token"

// hubService is a real service run on the hub next to cluster-import and namespace-binding.
type hubService interface {
	Mount(*server.Server)
	Run(context.Context) error
	Ready() <-chan struct{}
}

// newHubService builds an extra hub service on the hub's JetStream.
type newHubService func(ctx context.Context, js *testkit.JetStream) (hubService, error)

func startHub(t testing.TB, extra ...newHubService) *hubEnv {
	t.Helper()
	ctx := testkit.Context(t, 2*time.Minute)
	js := testkit.StartJetStream(t)
	log := testkit.Logger(t)
	ci, err := clusterimport.New(ctx, js.JS, clusterimport.Config{PlaintextCredentials: true}, log)
	if err != nil {
		t.Fatal(err)
	}
	nb, err := namespacebinding.New(ctx, js.JS, namespacebinding.Config{}, log)
	if err != nil {
		t.Fatal(err)
	}
	services := []hubService{ci, nb}
	for _, build := range extra {
		svc, err := build(ctx, js)
		if err != nil {
			t.Fatal(err)
		}
		services = append(services, svc)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, len(services))
	for _, svc := range services {
		go func() { _ = svc.Run(runCtx); done <- struct{}{} }()
	}
	t.Cleanup(func() {
		stop()
		for range services {
			<-done
		}
	})
	for _, svc := range services {
		select {
		case <-svc.Ready():
		case <-ctx.Done():
			t.Fatal("hub not ready in time")
		}
	}
	tokenFile := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(e2eToken+",alice\n"+bobToken+",bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{TokenFile: tokenFile}, log)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Authorize(t, js.JS, srv, authz.Config{PlatformAdmins: []string{"alice"}})
	for _, svc := range services {
		svc.Mount(srv)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &hubEnv{e2eEnv: &e2eEnv{url: hs.URL, tokenFile: tokenFile}, js: js}
}

// runAs runs fleetctl with a user's token instead of alice's.
func (h *hubEnv) runAs(t *testing.T, token string, args ...string) result {
	t.Helper()
	return h.runWith(t, context.Background(), nil, append([]string{"--server", h.url, "--token", token}, args...)...)
}

// agentApplied reports the desired object at key applied, as the cluster's agent would.
func (h *hubEnv) agentApplied(t *testing.T, key string, statusJSON string) {
	t.Helper()
	ctx := context.Background()
	desired, err := h.js.JS.KeyValue(ctx, subjects.DesiredNamespacesBucket)
	if err != nil {
		t.Fatal(err)
	}
	var rev uint64
	testkit.Eventually(t, 10*time.Second, func() error {
		e, err := desired.Get(ctx, key)
		if err == nil {
			rev = e.Revision()
		}
		return err
	})
	data, _ := proto.Marshal(&desiredv1.AppliedStatus{DesiredRevision: rev, Phase: desiredv1.Phase_PHASE_APPLIED, Time: timestamppb.Now(), StatusJson: []byte(statusJSON)})
	applied, err := h.js.JS.KeyValue(ctx, subjects.AppliedBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := applied.Put(ctx, subjects.AppliedKey(subjects.DesiredNamespacesBucket, key), data); err != nil {
		t.Fatal(err)
	}
}

type bindingJSON struct {
	Project   string            `json:"project"`
	Cluster   string            `json:"cluster"`
	Namespace string            `json:"namespace"`
	Phase     string            `json:"phase"`
	Hard      map[string]string `json:"hard"`
	Used      map[string]string `json:"used"`
}

type projectJSON struct {
	Name   string `json:"name"`
	Status struct {
		NamespaceCount int `json:"namespaceCount"`
		Clusters       []struct {
			Cluster string            `json:"cluster"`
			Hard    map[string]string `json:"hard"`
			Used    map[string]string `json:"used"`
		} `json:"clusters"`
	} `json:"status"`
}

func TestProjectAndNamespaceCommands(t *testing.T) {
	h := startHub(t)
	h.run(t, "cluster", "register", "c1").ok(t)
	h.run(t, "cluster", "register", "c2").ok(t)
	ctx := testkit.Context(t, time.Minute)
	if _, err := events.NewStore(h.js.JS, "agent").Append(ctx, subjects.AgentInventory("c1"), "c1", events.Any, &agentv1.NamespaceInventory{
		ClusterName: "c1", Namespaces: []*agentv1.Namespace{{Name: "default", Phase: "Active"}, {Name: "legacy", Phase: "Active"}, {Name: "web", Phase: "Active"}},
	}); err != nil {
		t.Fatal(err)
	}

	r := h.run(t, "project", "create", "team-a", "--display-name", "Team A", "--label", "org=web").ok(t)
	for _, want := range []string{"NAME", "team-a", "Team A", "org=web"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("create output lacks %q:\n%s", want, r.stdout)
		}
	}
	h.run(t, "project", "create", "team-b").ok(t)
	h.run(t, "project", "create", "team-a").fails(t, "error: already_exists: ")

	// Bind with a quota; a second project's claim on the same namespace is refused naming the owner.
	r = h.run(t, "namespace", "bind", "web", "--project", "team-a", "--cluster", "c1", "--hard", "cpu=2", "--hard", "memory=4Gi").ok(t)
	if !strings.Contains(r.stdout, "Pending") || !strings.Contains(r.stdout, "cpu=2,memory=4Gi") {
		t.Errorf("bind output:\n%s", r.stdout)
	}
	r = h.run(t, "namespace", "bind", "web", "-p", "team-b", "-c", "c1")
	r.fails(t, "error: already_exists: ")
	if !strings.Contains(r.stderr, `project "team-a"`) {
		t.Errorf("conflict does not name the owner: %s", r.stderr)
	}
	h.run(t, "namespace", "bind", "web", "-p", "team-b", "-c", "c2").ok(t)
	h.run(t, "namespace", "bind", "api", "-p", "team-a", "-c", "c1", "--hard", "cpu=-1").fails(t, `error: invalid_argument: hard["cpu"]: `)
	h.run(t, "namespace", "bind", "api", "-p", "team-a").fails(t, "error: at least one of the flags in the group [cluster placement] is required")

	// Idle: the inventory minus what is bound.
	r = h.run(t, "namespace", "idle", "c1").ok(t)
	if !strings.Contains(r.stdout, "legacy") || strings.Contains(r.stdout, "web") {
		t.Errorf("idle:\n%s", r.stdout)
	}
	h.run(t, "namespace", "idle", "nope").fails(t, "error: not_found: ")

	// The agent applies and reports usage; list and get show phase and sums.
	h.agentApplied(t, subjects.DesiredKey("c1", "Namespace", "", "web"), "")
	h.agentApplied(t, subjects.DesiredKey("c1", "ResourceQuota", "web", namespacebinding.QuotaName), `{"hard":{"cpu":"2","memory":"4Gi"},"used":{"cpu":"500m","memory":"1Gi"}}`)
	testkit.Eventually(t, 5*time.Second, func() error {
		list := jsonOf[[]bindingJSON](t, h.run(t, "-o", "json", "namespace", "list", "--project", "team-a").ok(t))
		if len(list) != 1 || list[0].Phase != "BINDING_PHASE_AVAILABLE" || list[0].Used["cpu"] != "500m" {
			return fmt.Errorf("bindings of team-a: %+v", list)
		}
		return nil
	})
	r = h.run(t, "namespace", "list", "--cluster", "c1").ok(t)
	if !strings.Contains(r.stdout, "Available") || !strings.Contains(r.stdout, "cpu=500m,memory=1Gi") {
		t.Errorf("list --cluster c1:\n%s", r.stdout)
	}
	h.run(t, "namespace", "quota", "web", "-p", "team-a", "-c", "c1", "--hard", "cpu=4", "--hard", "memory=4Gi").ok(t)
	p := jsonOf[projectJSON](t, h.run(t, "-o", "json", "project", "get", "team-a").ok(t))
	if p.Status.NamespaceCount != 1 || len(p.Status.Clusters) != 1 || p.Status.Clusters[0].Hard["cpu"] != "4" {
		t.Errorf("project get = %+v", p)
	}
	r = h.run(t, "project", "get", "team-a").ok(t)
	for _, want := range []string{"team-a", "CLUSTER", "c1", "cpu=4,memory=4Gi"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("project get lacks %q:\n%s", want, r.stdout)
		}
	}
	projects := jsonOf[[]projectJSON](t, h.run(t, "-o", "json", "project", "list", "-l", "org=web").ok(t))
	if len(projects) != 1 || projects[0].Name != "team-a" {
		t.Errorf("project list -l org=web = %+v", projects)
	}

	// Delete is refused while the project owns namespaces; --force unbinds them.
	h.run(t, "project", "delete", "team-a").fails(t, "error: failed_precondition: ")
	h.run(t, "project", "delete", "team-a", "--unbind-policy", "nuke").fails(t, `error: unbind policy "nuke"`)
	r = h.run(t, "project", "delete", "team-a", "--force").ok(t)
	if !strings.Contains(r.stdout, `project "team-a" deleted`) || !strings.Contains(r.stdout, "Terminating") {
		t.Errorf("forced delete:\n%s", r.stdout)
	}
	// Unbind with the delete policy.
	r = h.run(t, "namespace", "unbind", "web", "-p", "team-b", "-c", "c2", "--policy", "delete").ok(t)
	if !strings.Contains(r.stdout, "Terminating") {
		t.Errorf("unbind:\n%s", r.stdout)
	}
	h.run(t, "namespace", "unbind", "web", "-p", "team-b", "-c", "c1").fails(t, "error: not_found: ")
}

func TestProjectBudgetCommand(t *testing.T) {
	h := startHub(t)
	h.run(t, "cluster", "register", "c1").ok(t)
	h.run(t, "cluster", "register", "c2").ok(t)
	h.run(t, "project", "create", "team-a").ok(t)

	r := h.run(t, "project", "budget", "team-a", "--cluster", "c1", "--hard", "cpu=10", "--hard", "memory=20Gi").ok(t)
	for _, want := range []string{"CLUSTER", "BUDGET", "ALLOCATED", "c1", "cpu=10,memory=20Gi", "cpu=0,memory=0"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("budget output lacks %q:\n%s", want, r.stdout)
		}
	}
	h.run(t, "project", "budget", "team-a", "--hard", "cpu=1").fails(t, `error: required flag(s) "cluster" not set`)
	h.run(t, "project", "budget", "team-a", "-c", "c1").fails(t, "error: give the budget with --hard")
	h.run(t, "project", "budget", "team-a", "-c", "c1", "--hard", "cpu").fails(t, `error: --hard "cpu": want key=value`)
	h.run(t, "project", "budget", "team-a", "-c", "c1", "--hard", "cpu=ten").fails(t, `error: invalid_argument: hard["cpu"]: `)

	h.run(t, "namespace", "bind", "web", "-p", "team-a", "-c", "c1", "--hard", "cpu=6", "--hard", "memory=8Gi").ok(t)
	r = h.run(t, "namespace", "bind", "api", "-p", "team-a", "-c", "c1", "--hard", "cpu=6", "--hard", "memory=8Gi")
	r.fails(t, "error: failed_precondition: ")
	if !strings.Contains(r.stderr, "project team-a budget on cluster c1: cpu asks 6, 4 left of 10") {
		t.Errorf("refusal does not name resource, ask and what is left: %s", r.stderr)
	}
	h.run(t, "namespace", "bind", "api", "-p", "team-a", "-c", "c2", "--hard", "cpu=60").ok(t) // c2: unlimited

	r = h.run(t, "project", "get", "team-a").ok(t)
	for _, want := range []string{"BUDGET", "cpu=10,memory=20Gi", "cpu=6,memory=8Gi"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("project get lacks %q:\n%s", want, r.stdout)
		}
	}
	type budgetJSON struct {
		Budgets []struct {
			Cluster   string            `json:"cluster"`
			Hard      map[string]string `json:"hard"`
			Allocated map[string]string `json:"allocated"`
		} `json:"budgets"`
	}
	p := jsonOf[budgetJSON](t, h.run(t, "-o", "json", "project", "get", "team-a").ok(t))
	if len(p.Budgets) != 1 || p.Budgets[0].Cluster != "c1" || p.Budgets[0].Allocated["cpu"] != "6" || p.Budgets[0].Hard["memory"] != "20Gi" {
		t.Errorf("project get -o json budgets = %+v", p.Budgets)
	}

	r = h.run(t, "project", "budget", "team-a", "-c", "c1", "--hard", "cpu=4", "--hard", "memory=20Gi")
	r.fails(t, "error: failed_precondition: ")
	if !strings.Contains(r.stderr, "cpu 4 is below the 6 its namespaces hold") {
		t.Errorf("lowering below what is allocated: %s", r.stderr)
	}
	r = h.run(t, "project", "budget", "team-a", "-c", "c1", "--hard=").ok(t)
	if !strings.Contains(r.stdout, `project "team-a" has no budget on cluster "c1"`) {
		t.Errorf("removing the budget:\n%s", r.stdout)
	}
	h.run(t, "namespace", "bind", "api", "-p", "team-a", "-c", "c1", "--hard", "cpu=60").ok(t)
}
