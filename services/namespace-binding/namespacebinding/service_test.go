package namespacebinding_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

const testToken = "s3cret-test-token"

// viewerToken is user bob's, who is no platform admin (cluster set tests grant him roles).
const viewerToken = "viewer-test-token"

// env is a hub as fleetd runs it: cluster-import and namespace-binding on one JetStream and one
// HTTP server.
type env struct {
	js       *testkit.JetStream
	svc      *namespacebinding.Service
	client   projectv1connect.ProjectServiceClient
	clusters clusterv1connect.ClusterServiceClient
	sets     placementv1connect.ClusterSetServiceClient
	pl       placementv1connect.PlacementServiceClient
	// url and http reach the server without a token (bearerClient adds one).
	url  string
	http *http.Client
	// metrics is the registry /metrics serves.
	metrics *server.Registry
	stop    func()
}

func start(t testing.TB, j *testkit.JetStream, cfg namespacebinding.Config) *env {
	t.Helper()
	return startHub(t, j, cfg, clusterimport.Config{})
}

func startHub(t testing.TB, j *testkit.JetStream, cfg namespacebinding.Config, ciCfg clusterimport.Config) *env {
	t.Helper()
	if j == nil {
		j = testkit.StartJetStream(t)
	}
	log := testkit.Logger(t)
	srv, _ := testkit.TokenServer(t, j.JS, []string{testToken + ",alice", viewerToken + ",bob"}, authz.Config{PlatformAdmins: []string{"alice"}}, log)
	if ciCfg.Keyring == nil {
		ciCfg.PlaintextCredentials = true // these tests never read credentials back
	}
	ci, err := clusterimport.New(context.Background(), j.JS, ciCfg, log)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := namespacebinding.New(context.Background(), j.JS, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	stopHub := testkit.RunComponents(t, srv, ci, svc)
	hs := testkit.Serve(t, srv)
	hc := testkit.BearerClient(hs.Client(), testToken)
	e := &env{js: j, svc: svc, client: projectv1connect.NewProjectServiceClient(hc, hs.URL), clusters: clusterv1connect.NewClusterServiceClient(hc, hs.URL),
		sets: placementv1connect.NewClusterSetServiceClient(hc, hs.URL), pl: placementv1connect.NewPlacementServiceClient(hc, hs.URL),
		url: hs.URL, http: hs.Client(), metrics: srv.Registry()}
	e.stop = func() { hs.Close(); stopHub() }
	return e
}

func code(err error) connect.Code { return connect.CodeOf(err) }

func (e *env) register(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := e.clusters.RegisterCluster(context.Background(), connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: n})); err != nil {
			t.Fatalf("register %s: %v", n, err)
		}
	}
}

func (e *env) createProject(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := e.client.CreateProject(context.Background(), connect.NewRequest(&projectv1.CreateProjectRequest{Name: n})); err != nil {
			t.Fatalf("create project %s: %v", n, err)
		}
	}
}

func (e *env) bind(project, cluster, namespace string, hard map[string]string) (*projectv1.NamespaceBinding, error) {
	res, err := e.client.BindNamespace(context.Background(), connect.NewRequest(&projectv1.BindNamespaceRequest{
		Project: project, Cluster: cluster, Namespace: namespace, Hard: hard}))
	if err != nil {
		return nil, err
	}
	return res.Msg.Binding, nil
}

func (e *env) mustBind(t testing.TB, project, cluster, namespace string, hard map[string]string) *projectv1.NamespaceBinding {
	t.Helper()
	b, err := e.bind(project, cluster, namespace, hard)
	if err != nil {
		t.Fatalf("bind %s/%s to %s: %v", cluster, namespace, project, err)
	}
	return b
}

func (e *env) project(t testing.TB, name string) *projectv1.Project {
	t.Helper()
	res, err := e.client.GetProject(context.Background(), connect.NewRequest(&projectv1.GetProjectRequest{Name: name}))
	if err != nil {
		t.Fatalf("get project %s: %v", name, err)
	}
	return res.Msg.Project
}

func (e *env) binding(t testing.TB, project, cluster, namespace string) (*projectv1.NamespaceBinding, bool) {
	t.Helper()
	res, err := e.client.ListNamespaceBindings(context.Background(), connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: project, Cluster: cluster}))
	if err != nil {
		t.Fatalf("list bindings: %v", err)
	}
	for _, b := range res.Msg.Bindings {
		if b.Namespace == namespace {
			return b, true
		}
	}
	return nil, false
}

func (e *env) kv(t testing.TB, bucket string) jetstream.KeyValue {
	t.Helper()
	kv, err := e.js.JS.KeyValue(context.Background(), bucket)
	if err != nil {
		t.Fatalf("bucket %s: %v", bucket, err)
	}
	return kv
}

// desiredObject waits until the desired bucket holds an object at key that cond accepts.
func (e *env) desiredObject(t testing.TB, key string, cond func(*desiredv1.DesiredObject) bool) (*desiredv1.DesiredObject, uint64) {
	t.Helper()
	kv := e.kv(t, subjects.DesiredNamespacesBucket)
	var obj *desiredv1.DesiredObject
	var rev uint64
	testkit.Eventually(t, 10*time.Second, func() error {
		en, err := kv.Get(context.Background(), key)
		if err != nil {
			return fmt.Errorf("desired %s: %w", key, err)
		}
		obj = &desiredv1.DesiredObject{}
		if err := proto.Unmarshal(en.Value(), obj); err != nil {
			return err
		}
		if !cond(obj) {
			return fmt.Errorf("desired %s is %v", key, obj)
		}
		rev = en.Revision()
		return nil
	})
	return obj, rev
}

func anyObject(*desiredv1.DesiredObject) bool { return true }

// agentReports writes what a cluster's agent reports about the desired object at key: applied
// at its current revision, then whatever mutate changes.
func (e *env) agentReports(t testing.TB, key string, mutate func(st *desiredv1.AppliedStatus)) uint64 {
	t.Helper()
	obj, rev := e.desiredObject(t, key, anyObject)
	st := &desiredv1.AppliedStatus{DesiredRevision: rev, Phase: desiredv1.Phase_PHASE_APPLIED, Time: timestamppb.Now(), Absent: obj.Tombstone}
	if mutate != nil {
		mutate(st)
	}
	data, err := proto.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	appliedRev, err := e.kv(t, subjects.AppliedBucket).Put(context.Background(), subjects.AppliedKey(subjects.DesiredNamespacesBucket, key), data)
	if err != nil {
		t.Fatal(err)
	}
	return appliedRev
}

// releaseConsidered waits until the release loop has made a whole pass over the agents' reports
// up to appliedRev and the views have applied whatever it appended: a binding still there
// afterwards was not released, rather than not released yet.
func (e *env) releaseConsidered(t testing.TB, appliedRev uint64) {
	t.Helper()
	if err := e.svc.WaitReleasePass(testkit.Context(t, 10*time.Second), appliedRev); err != nil {
		t.Fatal(err)
	}
	testkit.WaitProjected(t, e.js.JS, namespacebinding.Projections()...)
}

// quotaUsed makes a quota report carry used (and hard as the desired spec says).
func quotaUsed(t testing.TB, hard, used map[string]string) func(*desiredv1.AppliedStatus) {
	return func(st *desiredv1.AppliedStatus) {
		data, err := json.Marshal(map[string]map[string]string{"hard": hard, "used": used})
		if err != nil {
			t.Fatal(err)
		}
		st.StatusJson = data
	}
}

func nsKey(cluster, ns string) string { return subjects.DesiredKey(cluster, "Namespace", "", ns) }
func quotaKey(cluster, ns string) string {
	return subjects.DesiredKey(cluster, "ResourceQuota", ns, namespacebinding.QuotaName)
}

func TestProjectLifecycle(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	res, err := e.client.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "team-a", DisplayName: "Team A", Labels: map[string]string{"org": "web"}}))
	if err != nil {
		t.Fatal(err)
	}
	if p := res.Msg.Project; p.Name != "team-a" || p.DisplayName != "Team A" || p.Revision == 0 || p.Status == nil {
		t.Fatalf("created %v", p)
	}
	e.createProject(t, "team-b")
	if _, err := e.client.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "team-a"})); code(err) != connect.CodeAlreadyExists {
		t.Fatalf("second create: %v", err)
	}
	list, err := e.client.ListProjects(ctx, connect.NewRequest(&projectv1.ListProjectsRequest{LabelSelector: "org=web"}))
	if err != nil || len(list.Msg.Projects) != 1 || list.Msg.Projects[0].Name != "team-a" {
		t.Fatalf("list org=web: %v %v", list, err)
	}
	if _, err := e.client.DeleteProject(ctx, connect.NewRequest(&projectv1.DeleteProjectRequest{Name: "team-a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.GetProject(ctx, connect.NewRequest(&projectv1.GetProjectRequest{Name: "team-a"})); code(err) != connect.CodeNotFound {
		t.Fatalf("get after delete: %v", err)
	}
	if _, err := e.client.DeleteProject(ctx, connect.NewRequest(&projectv1.DeleteProjectRequest{Name: "team-a"})); code(err) != connect.CodeNotFound {
		t.Fatalf("second delete: %v", err)
	}
	// The name is free again.
	e.createProject(t, "team-a")
}

func TestConcurrentProjectCreationsExactlyOneWins(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	testkit.OneWins(t, 8, connect.CodeAlreadyExists, func(int) error {
		_, err := e.client.CreateProject(context.Background(), connect.NewRequest(&projectv1.CreateProjectRequest{Name: "race"}))
		return err
	})
}

func TestInvalidInputNamesTheFieldAndWritesNothing(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.createProject(t, "team-a")
	ctx := testkit.Context(t, 30*time.Second)
	bind := func(p, c, n string, hard map[string]string) *projectv1.BindNamespaceRequest {
		return &projectv1.BindNamespaceRequest{Project: p, Cluster: c, Namespace: n, Hard: hard}
	}
	cases := []struct {
		name  string
		req   *projectv1.BindNamespaceRequest
		code  connect.Code
		field string
	}{
		{"empty project", bind("", "c1", "web", nil), connect.CodeInvalidArgument, "project:"},
		{"upper-case namespace", bind("team-a", "c1", "Web", nil), connect.CodeInvalidArgument, "namespace:"},
		{"dotted cluster", bind("team-a", "c.1", "web", nil), connect.CodeInvalidArgument, "cluster:"},
		{"long namespace", bind("team-a", "c1", strings.Repeat("n", 64), nil), connect.CodeInvalidArgument, "namespace:"},
		{"negative cpu", bind("team-a", "c1", "web", map[string]string{"cpu": "-1"}), connect.CodeInvalidArgument, `hard["cpu"]:`},
		{"unparsable memory", bind("team-a", "c1", "web", map[string]string{"cpu": "2", "memory": "4 GB"}), connect.CodeInvalidArgument, `hard["memory"]:`},
		{"bad resource name", bind("team-a", "c1", "web", map[string]string{"cpu!": "1"}), connect.CodeInvalidArgument, `hard["cpu!"]:`},
		{"unknown project", bind("team-z", "c1", "web", nil), connect.CodeNotFound, `project "team-z"`},
		{"unknown cluster", bind("team-a", "c9", "web", nil), connect.CodeNotFound, `cluster "c9"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.BindNamespace(ctx, connect.NewRequest(tc.req))
			if code(err) != tc.code || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got %v, want %v naming %s", err, tc.code, tc.field)
			}
		})
	}
	if _, err := e.client.UpdateQuota(ctx, connect.NewRequest(&projectv1.UpdateQuotaRequest{Project: "team-a", Cluster: "c1", Namespace: "web",
		Hard: map[string]string{"pods": "-3"}})); code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `hard["pods"]:`) {
		t.Fatalf("update quota with negative pods: %v", err)
	}
	if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web"})); code(err) != connect.CodeNotFound {
		t.Fatalf("unbind of an unbound namespace: %v", err)
	}
	if _, err := e.client.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "ok", Labels: map[string]string{"a b": "c"}})); code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `labels["a b"]`) {
		t.Fatalf("bad label: %v", err)
	}
	if _, err := e.client.ListIdleNamespaces(ctx, connect.NewRequest(&projectv1.ListIdleNamespacesRequest{Cluster: "c9"})); code(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "cluster") {
		t.Fatalf("idle of unknown cluster: %v", err)
	}
	// Nothing half-written: no claim, no binding, no desired object.
	for _, bucket := range []string{namespacebinding.ClaimsBucket, namespacebinding.BindingsBucket, subjects.DesiredNamespacesBucket} {
		ks, err := e.kv(t, bucket).ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range ks.Keys() {
			if k != "=meta" {
				t.Errorf("bucket %s holds %s after invalid requests", bucket, k)
			}
		}
	}
	if p := e.project(t, "team-a"); p.Status.NamespaceCount != 0 {
		t.Fatalf("project status %v", p.Status)
	}
}

func TestConflictingClaimIsRefusedNamingTheOwner(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a", "team-b")
	b := e.mustBind(t, "team-a", "c1", "web", nil)
	if b.Phase != projectv1.BindingPhase_BINDING_PHASE_PENDING || b.Id == "" || b.Project != "team-a" {
		t.Fatalf("bound %v", b)
	}
	_, err := e.bind("team-b", "c1", "web", nil)
	if code(err) != connect.CodeAlreadyExists || !strings.Contains(err.Error(), `project "team-a"`) {
		t.Fatalf("second claim: %v", err)
	}
	// The owner binding it again is refused too, without changing anything.
	if _, err := e.bind("team-a", "c1", "web", nil); code(err) != connect.CodeAlreadyExists {
		t.Fatalf("re-bind by the owner: %v", err)
	}
	// The same name on another cluster may belong to another project.
	e.mustBind(t, "team-b", "c2", "web", nil)
	// Another project cannot unbind or change what it does not own.
	if _, err := e.client.UnbindNamespace(context.Background(), connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-b", Cluster: "c1", Namespace: "web"})); code(err) != connect.CodeNotFound {
		t.Fatalf("unbind by a non-owner: %v", err)
	}
	if nsA, _ := e.desiredObject(t, nsKey("c1", "web"), anyObject); nsA.OwnerLabelValue != "team-a" {
		t.Fatalf("desired c1/web %v", nsA)
	}
	if nsB, _ := e.desiredObject(t, nsKey("c2", "web"), anyObject); nsB.OwnerLabelValue != "team-b" {
		t.Fatalf("desired c2/web %v", nsB)
	}
}

func TestConcurrentClaimsExactlyOneWins(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	projects := []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}
	e.createProject(t, projects...)
	errs := make([]error, len(projects))
	var wg sync.WaitGroup
	for i, p := range projects {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.bind(p, "c1", "shared", nil)
		}()
	}
	wg.Wait()
	winner := ""
	for i, err := range errs {
		switch {
		case err == nil:
			if winner != "" {
				t.Fatalf("both %s and %s won", winner, projects[i])
			}
			winner = projects[i]
		case code(err) != connect.CodeAlreadyExists:
			t.Fatalf("%s: unexpected %v", projects[i], err)
		}
	}
	if winner == "" {
		t.Fatal("nobody won")
	}
	for i, err := range errs {
		if err != nil && !strings.Contains(err.Error(), `"`+winner+`"`) {
			t.Errorf("%s's refusal does not name the owner %s: %v", projects[i], winner, err)
		}
	}
	res, err := e.client.ListNamespaceBindings(context.Background(), connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Cluster: "c1"}))
	if err != nil || len(res.Msg.Bindings) != 1 || res.Msg.Bindings[0].Project != winner {
		t.Fatalf("bindings of c1: %v %v", res, err)
	}
}

// Every command on a project appends to the project's one subject with an expectation; many
// concurrent binds of one project must queue for it, not fail after losing the race a few times.
func TestConcurrentBindsOfOneProjectAllLand(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.createProject(t, "team-a")
	const n = 48
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = e.bind("team-a", "c1", fmt.Sprintf("ns-%02d", i), map[string]string{"cpu": "1"}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("bind ns-%02d: %v", i, err)
		}
	}
	// Each bind answered only once its binding was visible.
	res, err := e.client.ListNamespaceBindings(context.Background(), connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: "team-a"}))
	if err != nil || len(res.Msg.Bindings) != n {
		t.Fatalf("bindings of team-a: %d %v", len(res.Msg.Bindings), err)
	}
	// And a command that decides from the bindings, right after, sees all of them.
	_, err = e.client.DeleteProject(context.Background(), connect.NewRequest(&projectv1.DeleteProjectRequest{Name: "team-a"}))
	if code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), fmt.Sprintf("%d namespace(s)", n)) {
		t.Fatalf("delete of a project owning %d namespaces: %v", n, err)
	}
}

func TestPhasesFollowTheAgentsReports(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.createProject(t, "team-a")
	e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "1"})
	e.mustBind(t, "team-a", "c1", "taken", nil)
	if b, _ := e.binding(t, "team-a", "c1", "web"); b.Phase != projectv1.BindingPhase_BINDING_PHASE_PENDING || b.Reason != namespacebinding.ReasonClusterUnreachable {
		t.Fatalf("before any report: %v", b)
	}
	// The namespace alone is not enough: the quota must be applied too.
	e.agentReports(t, nsKey("c1", "web"), nil)
	if b, _ := e.binding(t, "team-a", "c1", "web"); b.Phase != projectv1.BindingPhase_BINDING_PHASE_PENDING {
		t.Fatalf("namespace applied, quota not: %v", b)
	}
	e.agentReports(t, quotaKey("c1", "web"), nil)
	e.agentReports(t, nsKey("c1", "taken"), func(st *desiredv1.AppliedStatus) {
		st.Phase, st.Reason, st.Message = desiredv1.Phase_PHASE_FAILED, "OwnedByOther", `namespace taken is labelled fleetstream.io/project=team-x`
	})
	testkit.Eventually(t, 5*time.Second, func() error {
		web, _ := e.binding(t, "team-a", "c1", "web")
		taken, _ := e.binding(t, "team-a", "c1", "taken")
		if web.Phase != projectv1.BindingPhase_BINDING_PHASE_AVAILABLE {
			return fmt.Errorf("web %v", web)
		}
		if taken.Phase != projectv1.BindingPhase_BINDING_PHASE_FAILED || taken.Reason != "OwnedByOther" || !strings.Contains(taken.Message, "team-x") {
			return fmt.Errorf("taken %v", taken)
		}
		return nil
	})
	st := e.project(t, "team-a").Status
	if st.NamespaceCount != 2 || st.AvailableCount != 1 || st.FailedCount != 1 {
		t.Fatalf("project status %v", st)
	}
	// The transitions are recorded in the bindings view, which other services read.
	testkit.Eventually(t, 5*time.Second, func() error {
		for ns, want := range map[string]string{"web": "BINDING_PHASE_AVAILABLE/Applied", "taken": "BINDING_PHASE_FAILED/OwnedByOther"} {
			en, err := e.kv(t, namespacebinding.BindingsBucket).Get(context.Background(), keys.Join("c1", ns))
			if err != nil {
				return err
			}
			b := &projectv1.NamespaceBinding{}
			if err := proto.Unmarshal(en.Value(), b); err != nil {
				return err
			}
			if got := b.Phase.String() + "/" + b.Reason; got != want {
				return fmt.Errorf("view records %s for c1/%s, want %s", got, ns, want)
			}
		}
		return nil
	})
	// Deleted by hand on the cluster: the agent says it is absent while it recreates it.
	e.agentReports(t, nsKey("c1", "web"), func(st *desiredv1.AppliedStatus) { st.Absent = true })
	testkit.Eventually(t, 5*time.Second, func() error {
		if b, _ := e.binding(t, "team-a", "c1", "web"); b.Phase != projectv1.BindingPhase_BINDING_PHASE_PENDING || b.Reason != namespacebinding.ReasonRepairing {
			return fmt.Errorf("web %v", b)
		}
		return nil
	})
}

func TestQuotaSumsFollowLimitChanges(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a")
	ctx := testkit.Context(t, 30*time.Second)
	e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "2", "memory": "4Gi"})
	e.mustBind(t, "team-a", "c1", "api", map[string]string{"cpu": "500m"})
	e.mustBind(t, "team-a", "c2", "web", map[string]string{"cpu": "1", "pods": "10"})
	e.agentReports(t, quotaKey("c1", "web"), quotaUsed(t, map[string]string{"cpu": "2", "memory": "4Gi"}, map[string]string{"cpu": "1", "memory": "1Gi"}))
	e.agentReports(t, quotaKey("c1", "api"), quotaUsed(t, map[string]string{"cpu": "500m"}, map[string]string{"cpu": "250m"}))
	e.agentReports(t, quotaKey("c2", "web"), quotaUsed(t, map[string]string{"cpu": "1", "pods": "10"}, map[string]string{"cpu": "0", "pods": "3"}))

	type sums struct{ hard, used map[string]string }
	expect := func(want map[string]sums) {
		t.Helper()
		testkit.Eventually(t, 5*time.Second, func() error {
			st := e.project(t, "team-a").Status
			got := map[string]sums{}
			for _, c := range st.Clusters {
				got[c.Cluster] = sums{c.Hard, c.Used}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("sums %v, want %v", got, want)
			}
			return nil
		})
	}
	expect(map[string]sums{
		"c1": {map[string]string{"cpu": "2500m", "memory": "4Gi"}, map[string]string{"cpu": "1250m", "memory": "1Gi"}},
		"c2": {map[string]string{"cpu": "1", "pods": "10"}, map[string]string{"cpu": "0", "pods": "3"}},
	})
	// Raising a limit replaces the old figure: 2 → 4 makes c1's cpu 4.5, not 6.5.
	res, err := e.client.UpdateQuota(ctx, connect.NewRequest(&projectv1.UpdateQuotaRequest{Project: "team-a", Cluster: "c1", Namespace: "web",
		Hard: map[string]string{"cpu": "4", "memory": "4Gi"}}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.Binding.Hard["cpu"] != "4" {
		t.Fatalf("updated %v", res.Msg.Binding)
	}
	if q, _ := e.desiredObject(t, quotaKey("c1", "web"), func(o *desiredv1.DesiredObject) bool { return strings.Contains(string(o.Manifest), `"cpu":"4"`) }); !q.ReportStatus {
		t.Fatalf("quota %v", q)
	}
	// The agent reports again (usage moved too); repeated reports change nothing.
	for range 3 {
		e.agentReports(t, quotaKey("c1", "web"), quotaUsed(t, map[string]string{"cpu": "4", "memory": "4Gi"}, map[string]string{"cpu": "3", "memory": "1Gi"}))
	}
	expect(map[string]sums{
		"c1": {map[string]string{"cpu": "4500m", "memory": "4Gi"}, map[string]string{"cpu": "3250m", "memory": "1Gi"}},
		"c2": {map[string]string{"cpu": "1", "pods": "10"}, map[string]string{"cpu": "0", "pods": "3"}},
	})
	// Removing the limits removes the quota and its figures.
	if _, err := e.client.UpdateQuota(ctx, connect.NewRequest(&projectv1.UpdateQuotaRequest{Project: "team-a", Cluster: "c2", Namespace: "web"})); err != nil {
		t.Fatal(err)
	}
	e.desiredObject(t, quotaKey("c2", "web"), func(o *desiredv1.DesiredObject) bool {
		return o.Tombstone && o.DeletionPolicy == desiredv1.DeletionPolicy_DELETION_POLICY_DELETE
	})
	// Unbinding takes the namespace out of the sums at once.
	if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "api"})); err != nil {
		t.Fatal(err)
	}
	expect(map[string]sums{
		"c1": {map[string]string{"cpu": "4", "memory": "4Gi"}, map[string]string{"cpu": "3", "memory": "1Gi"}},
		"c2": {nil, nil},
	})
}

func TestUnbindWritesTombstonesAndReleasesOnceApplied(t *testing.T) {
	cases := []struct {
		name   string
		policy projectv1.UnbindPolicy
		want   desiredv1.DeletionPolicy
	}{
		{"keep by default", projectv1.UnbindPolicy_UNBIND_POLICY_UNSPECIFIED, desiredv1.DeletionPolicy_DELETION_POLICY_ORPHAN},
		{"delete", projectv1.UnbindPolicy_UNBIND_POLICY_DELETE, desiredv1.DeletionPolicy_DELETION_POLICY_DELETE},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, nil, namespacebinding.Config{ReleaseInterval: 100 * time.Millisecond})
			e.register(t, "c1")
			e.createProject(t, "team-a", "team-b")
			ctx := testkit.Context(t, 30*time.Second)
			e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "1"})
			e.agentReports(t, nsKey("c1", "web"), nil)
			e.agentReports(t, quotaKey("c1", "web"), nil)
			res, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web", Policy: tc.policy}))
			if err != nil {
				t.Fatal(err)
			}
			if b := res.Msg.Binding; b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
				t.Fatalf("unbound %v", b)
			}
			e.desiredObject(t, nsKey("c1", "web"), func(o *desiredv1.DesiredObject) bool {
				return o.Tombstone && o.DeletionPolicy == tc.want && o.OwnerLabelValue == "team-a"
			})
			e.desiredObject(t, quotaKey("c1", "web"), func(o *desiredv1.DesiredObject) bool {
				return o.Tombstone && o.DeletionPolicy == desiredv1.DeletionPolicy_DELETION_POLICY_DELETE
			})
			// The claim goes with the unbind, but another project must wait for the agent to
			// release the namespace: it would otherwise find it labelled for team-a.
			if _, err := e.kv(t, namespacebinding.ClaimsBucket).Get(ctx, keys.Join("c1", "web")); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Fatalf("claim after unbind: %v", err)
			}
			if _, err := e.bind("team-b", "c1", "web", nil); code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), `project "team-a"`) {
				t.Fatalf("bind by another project while Terminating: %v", err)
			}
			// Terminating until the agent has applied both tombstones.
			e.releaseConsidered(t, 0)
			if b, ok := e.binding(t, "team-a", "c1", "web"); !ok || b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
				t.Fatalf("before the agent acted: %v", b)
			}
			e.releaseConsidered(t, e.agentReports(t, nsKey("c1", "web"), nil))
			if _, ok := e.binding(t, "team-a", "c1", "web"); !ok {
				t.Fatal("released before the quota's tombstone was applied")
			}
			e.agentReports(t, quotaKey("c1", "web"), nil)
			testkit.Eventually(t, 5*time.Second, func() error {
				if b, ok := e.binding(t, "team-a", "c1", "web"); ok {
					return fmt.Errorf("still there: %v", b)
				}
				return nil
			})
			if st := e.project(t, "team-a").Status; st.NamespaceCount != 0 || st.TerminatingCount != 0 {
				t.Fatalf("project status %v", st)
			}
			// The carried-out tombstones are garbage-collected with the release.
			testkit.Eventually(t, 5*time.Second, func() error {
				for _, k := range []string{nsKey("c1", "web"), quotaKey("c1", "web")} {
					if _, err := e.kv(t, subjects.DesiredNamespacesBucket).Get(ctx, k); !errors.Is(err, jetstream.ErrKeyNotFound) {
						return fmt.Errorf("desired %s after the release: %v", k, err)
					}
				}
				return nil
			})
			// Another project may now have it.
			e.mustBind(t, "team-b", "c1", "web", nil)
			e.desiredObject(t, nsKey("c1", "web"), func(o *desiredv1.DesiredObject) bool { return !o.Tombstone && o.OwnerLabelValue == "team-b" })
		})
	}
}

func TestRebindByTheSameProjectWhileTerminating(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.createProject(t, "team-a")
	ctx := testkit.Context(t, 30*time.Second)
	first := e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "1"})
	if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web"})); err != nil {
		t.Fatal(err)
	}
	// Unbinding again with another policy only changes the policy.
	res, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web", Policy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE}))
	if err != nil || res.Msg.Binding.UnbindPolicy != projectv1.UnbindPolicy_UNBIND_POLICY_DELETE {
		t.Fatalf("second unbind: %v %v", res, err)
	}
	e.desiredObject(t, nsKey("c1", "web"), func(o *desiredv1.DesiredObject) bool {
		return o.Tombstone && o.DeletionPolicy == desiredv1.DeletionPolicy_DELETION_POLICY_DELETE
	})
	second := e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "2"})
	if second.Id == first.Id || second.Phase != projectv1.BindingPhase_BINDING_PHASE_PENDING {
		t.Fatalf("re-bound %v", second)
	}
	e.desiredObject(t, nsKey("c1", "web"), func(o *desiredv1.DesiredObject) bool { return !o.Tombstone && o.OwnerLabelValue == "team-a" })
	e.desiredObject(t, quotaKey("c1", "web"), func(o *desiredv1.DesiredObject) bool {
		return !o.Tombstone && strings.Contains(string(o.Manifest), `"cpu":"2"`)
	})
	if st := e.project(t, "team-a").Status; st.NamespaceCount != 1 || st.TerminatingCount != 0 || st.Clusters[0].Hard["cpu"] != "2" {
		t.Fatalf("project status %v", st)
	}
}

// An unbinding whose caller never dropped its claim (it died, or its wait for the view found
// the binding already released, as a placement's follower met under load) must not hold the
// (cluster, namespace) once the binding is released: before, every bind of it was refused until
// ClaimGrace passed (the scale simulator's placement moves of ~3 minutes).
func TestReleaseDropsTheClaimItsUnbindingLeft(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{ReleaseInterval: 100 * time.Millisecond, ClaimGrace: 10 * time.Minute})
	e.register(t, "c1")
	e.createProject(t, "team-a", "team-b")
	ctx := testkit.Context(t, 30*time.Second)
	first := e.mustBind(t, "team-a", "c1", "web", nil)
	e.agentReports(t, nsKey("c1", "web"), nil)
	if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web",
		Policy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE})); err != nil {
		t.Fatal(err)
	}
	// The claim as an unbinding that stopped after its event leaves it.
	claims := e.kv(t, namespacebinding.ClaimsBucket)
	data, _ := proto.Marshal(&projectv1.Claim{Project: "team-a", BindingId: first.Id, CreateTime: timestamppb.Now()})
	if _, err := claims.Create(ctx, keys.Join("c1", "web"), data); err != nil {
		t.Fatal(err)
	}
	e.releaseConsidered(t, e.agentReports(t, nsKey("c1", "web"), nil))
	testkit.Eventually(t, 5*time.Second, func() error {
		if b, ok := e.binding(t, "team-a", "c1", "web"); ok {
			return fmt.Errorf("still there: %v", b)
		}
		if _, err := claims.Get(ctx, keys.Join("c1", "web")); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("claim of the released binding: %v", err)
		}
		return nil
	})
	e.mustBind(t, "team-b", "c1", "web", nil)
}

func TestDeleteProjectRefusedWhileItOwnsNamespacesUnlessForced(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a")
	ctx := testkit.Context(t, 30*time.Second)
	e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "1"})
	e.mustBind(t, "team-a", "c2", "web", nil)
	_, err := e.client.DeleteProject(ctx, connect.NewRequest(&projectv1.DeleteProjectRequest{Name: "team-a"}))
	if code(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "c1/web") {
		t.Fatalf("delete of an owning project: %v", err)
	}
	e.project(t, "team-a") // still there
	res, err := e.client.DeleteProject(ctx, connect.NewRequest(&projectv1.DeleteProjectRequest{Name: "team-a", Force: true, UnbindPolicy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE}))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Msg.Unbound) != 2 {
		t.Fatalf("unbound %v", res.Msg.Unbound)
	}
	if _, err := e.client.GetProject(ctx, connect.NewRequest(&projectv1.GetProjectRequest{Name: "team-a"})); code(err) != connect.CodeNotFound {
		t.Fatalf("get after forced delete: %v", err)
	}
	for _, c := range []string{"c1", "c2"} {
		e.desiredObject(t, nsKey(c, "web"), func(o *desiredv1.DesiredObject) bool {
			return o.Tombstone && o.DeletionPolicy == desiredv1.DeletionPolicy_DELETION_POLICY_DELETE
		})
	}
	// A bind to the deleted project is refused and leaves no claim.
	if _, err := e.bind("team-a", "c1", "api", nil); code(err) != connect.CodeNotFound {
		t.Fatalf("bind to a deleted project: %v", err)
	}
	if _, err := e.kv(t, namespacebinding.ClaimsBucket).Get(ctx, keys.Join("c1", "api")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("claim left behind: %v", err)
	}
}

func TestIdleNamespacesAreTheInventoryMinusClaims(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{ReleaseInterval: 100 * time.Millisecond})
	e.register(t, "c1")
	e.createProject(t, "team-a")
	ctx := testkit.Context(t, 30*time.Second)
	// Importing an in-use cluster: everything it reports is idle, nothing is assigned; the
	// protected namespaces (default, kube-system) are never anyone's, so never idle.
	inv := &agentv1.NamespaceInventory{ClusterName: "c1", Namespaces: []*agentv1.Namespace{
		{Name: "default", Phase: "Active"}, {Name: "kube-system", Phase: "Active"},
		{Name: "web", Phase: "Active", Labels: map[string]string{"app": "web"}}, {Name: "api", Phase: "Active"},
	}}
	if _, err := events.NewStore(e.js.JS, "agent").Append(ctx, subjects.AgentInventory("c1"), "c1", events.Any, inv); err != nil {
		t.Fatal(err)
	}
	idle := func() []string {
		res, err := e.client.ListIdleNamespaces(ctx, connect.NewRequest(&projectv1.ListIdleNamespacesRequest{Cluster: "c1"}))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, n := range res.Msg.Namespaces {
			names = append(names, n.Name)
		}
		return names
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if got := fmt.Sprint(idle()); got != "[web api]" {
			return fmt.Errorf("idle %s", got)
		}
		return nil
	})
	if st := e.project(t, "team-a").Status; st.NamespaceCount != 0 {
		t.Fatalf("import assigned namespaces: %v", st)
	}
	e.mustBind(t, "team-a", "c1", "web", nil)
	if got := fmt.Sprint(idle()); got != "[api]" {
		t.Fatalf("idle after binding web: %s", got)
	}
	if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web"})); err != nil {
		t.Fatal(err)
	}
	// Idle again once the agent has released it.
	if got := fmt.Sprint(idle()); got != "[api]" {
		t.Fatalf("idle while web is being unbound: %s", got)
	}
	// The agent acts on the tombstone, so report only once the desired view shows it (a
	// report about the earlier object would confirm nothing; this raced under load in CI).
	e.desiredObject(t, nsKey("c1", "web"), func(o *desiredv1.DesiredObject) bool { return o.Tombstone })
	e.agentReports(t, nsKey("c1", "web"), nil)
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := fmt.Sprint(idle()); got != "[web api]" {
			return fmt.Errorf("idle after unbinding web: %s", got)
		}
		return nil
	})
}

func TestOrphanClaimsAreRepaired(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, namespacebinding.Config{ClaimGrace: time.Second, RepairInterval: 200 * time.Millisecond})
	e.register(t, "c1")
	e.createProject(t, "team-a", "team-b")
	ctx := testkit.Context(t, 30*time.Second)
	claims := e.kv(t, namespacebinding.ClaimsBucket)
	// A bind that crashed between its claim and its event: the claim names a binding that
	// never appears in the stream.
	orphan := func(ns string) {
		data, _ := proto.Marshal(&projectv1.Claim{Project: "team-a", BindingId: "never-appended-" + ns, CreateTime: timestamppb.Now()})
		if _, err := claims.Create(ctx, keys.Join("c1", ns), data); err != nil {
			t.Fatal(err)
		}
	}
	orphan("web")
	// Within the grace period it still protects the bind that may be in flight.
	if _, err := e.bind("team-b", "c1", "web", nil); code(err) != connect.CodeAlreadyExists {
		t.Fatalf("bind over a fresh claim: %v", err)
	}
	// Past it, the repair loop releases it.
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := claims.Get(ctx, keys.Join("c1", "web")); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("orphan claim still there: %v", err)
		}
		return nil
	})
	e.mustBind(t, "team-b", "c1", "web", nil)
	// A lost claim of a live binding is restored from the stream.
	if err := claims.Purge(ctx, keys.Join("c1", "web")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		en, err := claims.Get(ctx, keys.Join("c1", "web"))
		if err != nil {
			return err
		}
		c := &projectv1.Claim{}
		if err := proto.Unmarshal(en.Value(), c); err != nil || c.Project != "team-b" {
			return fmt.Errorf("restored claim %v %v", c, err)
		}
		return nil
	})
}

func TestRestartKeepsState(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a", "team-b")
	e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "2"})
	e.mustBind(t, "team-b", "c2", "web", nil)
	e.agentReports(t, nsKey("c1", "web"), nil)
	e.agentReports(t, quotaKey("c1", "web"), quotaUsed(t, map[string]string{"cpu": "2"}, map[string]string{"cpu": "1"}))
	var before *projectv1.Project
	testkit.Eventually(t, 5*time.Second, func() error {
		before = e.project(t, "team-a")
		if before.Status.AvailableCount != 1 || len(before.Status.Clusters) != 1 || before.Status.Clusters[0].Used["cpu"] != "1" {
			return fmt.Errorf("before restart: %v", before.Status)
		}
		return nil
	})
	e.stop()

	e2 := start(t, j, namespacebinding.Config{})
	after := e2.project(t, "team-a")
	if !proto.Equal(before, after) {
		t.Fatalf("after restart:\n%v\nwant\n%v", after, before)
	}
	if _, err := e2.bind("team-a", "c2", "web", nil); code(err) != connect.CodeAlreadyExists || !strings.Contains(err.Error(), "team-b") {
		t.Fatalf("claim after restart: %v", err)
	}
	e2.mustBind(t, "team-b", "c1", "api", nil)
}

func TestWatchProjectsStreamsStatusChanges(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.createProject(t, "team-a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := e.client.WatchProjects(ctx, connect.NewRequest(&projectv1.WatchProjectsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	next := func(want func(*projectv1.WatchProjectsResponse) bool) {
		t.Helper()
		for stream.Receive() {
			if want(stream.Msg()) {
				return
			}
		}
		t.Fatalf("watch ended: %v", stream.Err())
	}
	next(func(r *projectv1.WatchProjectsResponse) bool {
		return r.Type == projectv1.WatchProjectsResponse_EVENT_TYPE_ADDED && r.Project.Name == "team-a"
	})
	e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "1"})
	next(func(r *projectv1.WatchProjectsResponse) bool {
		return r.Type == projectv1.WatchProjectsResponse_EVENT_TYPE_MODIFIED && r.Project.Status.NamespaceCount == 1
	})
	e.agentReports(t, quotaKey("c1", "web"), quotaUsed(t, map[string]string{"cpu": "1"}, map[string]string{"cpu": "300m"}))
	next(func(r *projectv1.WatchProjectsResponse) bool {
		cs := r.Project.GetStatus().GetClusters()
		return len(cs) == 1 && cs[0].Used["cpu"] == "300m"
	})
	e.createProject(t, "team-b")
	next(func(r *projectv1.WatchProjectsResponse) bool {
		return r.Type == projectv1.WatchProjectsResponse_EVENT_TYPE_ADDED && r.Project.Name == "team-b"
	})
	if _, err := e.client.DeleteProject(ctx, connect.NewRequest(&projectv1.DeleteProjectRequest{Name: "team-b"})); err != nil {
		t.Fatal(err)
	}
	next(func(r *projectv1.WatchProjectsResponse) bool {
		return r.Type == projectv1.WatchProjectsResponse_EVENT_TYPE_DELETED && r.Project.Name == "team-b"
	})
}

// Deregistration releases every binding of the cluster, active or being unbound (no agent is
// left to confirm anything); a cluster merely missing from the registry view (a view being
// rebuilt) keeps its bindings.
func TestDeregistrationReleasesTheClustersBindings(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{ReleaseInterval: 100 * time.Millisecond})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a", "team-b")
	ctx := testkit.Context(t, 60*time.Second)
	e.mustBind(t, "team-a", "c1", "web", map[string]string{"cpu": "1"})
	e.mustBind(t, "team-a", "c1", "api", nil)
	if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "api"})); err != nil {
		t.Fatal(err)
	}
	e.mustBind(t, "team-a", "c2", "web", nil)

	// c2 vanishes from the registry view without a deregistration: nothing is released.
	if err := e.kv(t, subjects.ClustersBucket).Delete(ctx, keys.Encode("c2")); err != nil {
		t.Fatal(err)
	}
	e.releaseConsidered(t, 0)
	if _, ok := e.binding(t, "team-a", "c2", "web"); !ok {
		t.Fatal("a binding was released because its cluster was missing from the registry view")
	}

	if _, err := e.clusters.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		for _, ns := range []string{"web", "api"} {
			if b, ok := e.binding(t, "team-a", "c1", ns); ok {
				return fmt.Errorf("binding of %s on deregistered c1 still %s", ns, b.Phase)
			}
		}
		return nil
	})
	if st := e.project(t, "team-a").Status; st.NamespaceCount != 1 || st.TerminatingCount != 0 {
		t.Fatalf("team-a's status after c1's deregistration: %v, want only c2's web", st)
	}
	// The claims went with the bindings: a re-registered c1 is free for anyone.
	e.register(t, "c1")
	e.mustBind(t, "team-b", "c1", "web", nil)
}
