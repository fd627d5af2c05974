package rbacsync_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/authz"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// Users of the test token file; "admin" is the platform admin; "dave" is in group "binders".
var testUsers = []string{"admin", "alice", "bob", "carol", "dave"}

func tokenOf(user string) string { return "token-of-" + user }

// env is a hub as fleetd runs it: cluster-import, namespace-binding and rbac-sync on one
// JetStream and one HTTP server, with an API client per user.
type env struct {
	js       *testkit.JetStream
	svc      *rbacsync.Service
	url      string
	as       map[string]rbacv1connect.RBACServiceClient
	rbac     rbacv1connect.RBACServiceClient // as admin
	clusters clusterv1connect.ClusterServiceClient
	projects projectv1connect.ProjectServiceClient
	desired  jetstream.KeyValue
	metrics  *server.Registry
	stop     func()
}

// withoutNamespaceBinding starts the hub without namespace-binding, as when rbac-sync starts
// first.
type startOption int

const withoutNamespaceBinding startOption = 1

func start(t testing.TB, j *testkit.JetStream, cfg rbacsync.Config, opts ...startOption) *env {
	t.Helper()
	withNB := !slices.Contains(opts, withoutNamespaceBinding)
	if j == nil {
		j = testkit.StartJetStream(t)
	}
	admins := []string{"admin"}
	log := testkit.Logger(t)
	var lines []string
	for _, u := range testUsers {
		line := tokenOf(u) + "," + u
		if u == "dave" {
			line += `,uid-dave,"binders,others"`
		}
		lines = append(lines, line)
	}
	srv, _ := testkit.TokenServer(t, j.JS, lines, authz.Config{PlatformAdmins: admins}, log)
	ctx := context.Background()
	ci, err := clusterimport.New(ctx, j.JS, clusterimport.Config{PlaintextCredentials: true}, log)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rbacsync.New(ctx, j.JS, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	components := []server.Component{ci, svc}
	if withNB {
		nb, err := namespacebinding.New(ctx, j.JS, namespacebinding.Config{}, log)
		if err != nil {
			t.Fatal(err)
		}
		components = append(components, nb)
	}
	stopHub := testkit.RunComponents(t, srv, components...)
	hs := testkit.Serve(t, srv)
	e := &env{js: j, svc: svc, url: hs.URL, as: map[string]rbacv1connect.RBACServiceClient{}, metrics: srv.Registry()}
	for _, u := range testUsers {
		e.as[u] = rbacv1connect.NewRBACServiceClient(testkit.BearerClient(hs.Client(), tokenOf(u)), hs.URL)
	}
	admin := testkit.BearerClient(hs.Client(), tokenOf("admin"))
	e.rbac = e.as["admin"]
	e.clusters = clusterv1connect.NewClusterServiceClient(admin, hs.URL)
	e.projects = projectv1connect.NewProjectServiceClient(admin, hs.URL)
	if e.desired, err = j.JS.KeyValue(ctx, subjects.DesiredRBACBucket); err != nil {
		t.Fatal(err)
	}
	e.stop = func() { hs.Close(); stopHub() }
	return e
}

func code(err error) connect.Code { return connect.CodeOf(err) }

func bg() context.Context { return context.Background() }

// Shortcuts for the other services' APIs.

func (e *env) register(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := e.clusters.RegisterCluster(bg(), connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: n})); err != nil {
			t.Fatalf("register %s: %v", n, err)
		}
	}
}

func (e *env) deregister(t testing.TB, name string) {
	t.Helper()
	if _, err := e.clusters.DeregisterCluster(bg(), connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: name})); err != nil {
		t.Fatalf("deregister %s: %v", name, err)
	}
}

func (e *env) createProject(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := e.projects.CreateProject(bg(), connect.NewRequest(&projectv1.CreateProjectRequest{Name: n})); err != nil {
			t.Fatalf("create project %s: %v", n, err)
		}
	}
}

func (e *env) bindNS(t testing.TB, project, cluster string, namespaces ...string) {
	t.Helper()
	for _, ns := range namespaces {
		if _, err := e.projects.BindNamespace(bg(), connect.NewRequest(&projectv1.BindNamespaceRequest{Project: project, Cluster: cluster, Namespace: ns})); err != nil {
			t.Fatalf("bind %s/%s to %s: %v", cluster, ns, project, err)
		}
	}
}

func (e *env) unbindNS(t testing.TB, project, cluster, ns string) {
	t.Helper()
	if _, err := e.projects.UnbindNamespace(bg(), connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: project, Cluster: cluster, Namespace: ns})); err != nil {
		t.Fatalf("unbind %s/%s from %s: %v", cluster, ns, project, err)
	}
}

// releaseNS plays the cluster's agent confirming that it carried out the tombstone of an
// unbound namespace, which namespace-binding waits for before the namespace may be bound again.
func (e *env) releaseNS(t testing.TB, cluster, ns string) {
	t.Helper()
	ctx := context.Background()
	desiredKV, err := e.js.JS.KeyValue(ctx, subjects.DesiredNamespacesBucket)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := e.js.JS.KeyValue(ctx, subjects.AppliedBucket)
	if err != nil {
		t.Fatal(err)
	}
	key := subjects.DesiredKey(cluster, "Namespace", "", ns)
	testkit.Eventually(t, 10*time.Second, func() error {
		en, err := desiredKV.Get(ctx, key)
		if err != nil {
			return err
		}
		obj := &desiredv1.DesiredObject{}
		if err := proto.Unmarshal(en.Value(), obj); err != nil || !obj.Tombstone {
			return fmt.Errorf("namespace %s/%s not tombstoned yet", cluster, ns)
		}
		data, _ := proto.Marshal(&desiredv1.AppliedStatus{DesiredRevision: en.Revision(), Phase: desiredv1.Phase_PHASE_APPLIED, Absent: true})
		_, err = applied.Put(ctx, subjects.AppliedKey(subjects.DesiredNamespacesBucket, key), data)
		return err
	})
}

// rbac-sync shortcuts.

func rule(group, resource string, verbs ...string) *rbacv1.PolicyRule {
	return &rbacv1.PolicyRule{ApiGroups: []string{group}, Resources: []string{resource}, Verbs: verbs}
}

func user(name string) *rbacv1.Subject {
	return &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: name}
}

func (e *env) createTemplate(t testing.TB, name string, inherits []string, rules ...*rbacv1.PolicyRule) *rbacv1.RoleTemplate {
	t.Helper()
	res, err := e.rbac.CreateRoleTemplate(bg(), connect.NewRequest(&rbacv1.CreateRoleTemplateRequest{Template: &rbacv1.RoleTemplate{Name: name, Rules: rules, Inherits: inherits}}))
	if err != nil {
		t.Fatalf("create template %s: %v", name, err)
	}
	return res.Msg.Template
}

func (e *env) bindRole(t testing.TB, project string, s *rbacv1.Subject, role string) *rbacv1.BindProjectRoleResponse {
	t.Helper()
	res, err := e.rbac.BindProjectRole(bg(), connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: project, Subject: s, RoleTemplate: role}))
	if err != nil {
		t.Fatalf("bind %s %s in %s: %v", role, s.Name, project, err)
	}
	return res.Msg
}

func (e *env) unbindRole(t testing.TB, project string, s *rbacv1.Subject, role string) {
	t.Helper()
	if _, err := e.rbac.UnbindProjectRole(bg(), connect.NewRequest(&rbacv1.UnbindProjectRoleRequest{Project: project, Subject: s, RoleTemplate: role})); err != nil {
		t.Fatalf("unbind %s %s in %s: %v", role, s.Name, project, err)
	}
}

// Desired state as the agents see it.

func crKey(cluster, template string) string {
	return subjects.DesiredKey(cluster, "ClusterRole", "", rbacsync.ObjectName(template))
}

func rbKey(cluster, namespace, template string) string {
	return subjects.DesiredKey(cluster, "RoleBinding", namespace, rbacsync.ObjectName(template))
}

type entry struct {
	obj      *desiredv1.DesiredObject
	revision uint64
	present  bool
}

func (e *env) get(t testing.TB, key string) entry {
	t.Helper()
	kve, err := e.desired.Get(bg(), key)
	if err != nil {
		return entry{}
	}
	obj := &desiredv1.DesiredObject{}
	if err := proto.Unmarshal(kve.Value(), obj); err != nil {
		t.Fatalf("decode %s: %v", key, err)
	}
	return entry{obj: obj, revision: kve.Revision(), present: true}
}

type manifest struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Rules []struct {
		Verbs     []string `json:"verbs"`
		APIGroups []string `json:"apiGroups"`
		Resources []string `json:"resources"`
	} `json:"rules"`
	RoleRef struct {
		Name string `json:"name"`
	} `json:"roleRef"`
	Subjects []struct {
		Kind      string `json:"kind"`
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"subjects"`
}

func decode(t testing.TB, obj *desiredv1.DesiredObject) manifest {
	t.Helper()
	var m manifest
	if err := json.Unmarshal(obj.Manifest, &m); err != nil {
		t.Fatalf("manifest %q: %v", obj.Manifest, err)
	}
	return m
}

// subjectNames lists the names of a RoleBinding's subjects, or nil when the entry is absent or
// a tombstone.
func (e *env) subjectNames(t testing.TB, key string) []string {
	en := e.get(t, key)
	if !en.present || en.obj.Tombstone {
		return nil
	}
	var out []string
	for _, s := range decode(t, en.obj).Subjects {
		out = append(out, s.Name)
	}
	return out
}

// state is what a key holds, for comparisons: "absent", "tombstone" or the subjects/rules.
func (e *env) state(t testing.TB, key string) string {
	en := e.get(t, key)
	switch {
	case !en.present:
		return "absent"
	case en.obj.Tombstone:
		return "tombstone"
	}
	m := decode(t, en.obj)
	if m.Kind == "ClusterRole" {
		var out []string
		for _, r := range m.Rules {
			out = append(out, r.Resources...)
		}
		return "rules:" + join(out)
	}
	names := e.subjectNames(t, key)
	return "subjects:" + join(names)
}

func join(s []string) string {
	s = slices.Clone(s)
	slices.Sort(s)
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ","
		}
		out += x
	}
	return out
}

// waitState waits until key holds want (see state). "absent" is checked once the fan-out has
// provably taken every event appended so far (settle): waiting for absence alone would pass
// before the fan-out had written what it was about to write.
func (e *env) waitState(t testing.TB, key, want string) {
	t.Helper()
	if want == "absent" {
		e.settle(t)
		if got := e.state(t, key); got != want {
			t.Fatal(&mismatch{key: key, got: got, want: want})
		}
		return
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := e.state(t, key); got != want {
			return &mismatch{key: key, got: got, want: want}
		}
		return nil
	})
}

// settle waits until the fan-out's input views have applied every event appended so far (their
// checkpoints pass the last event they read) and the fan-out has taken all their changes and
// written what they imply.
func (e *env) settle(t testing.TB) {
	t.Helper()
	inputs := map[string]bool{rbacsync.TemplatesBucket: true, rbacsync.BindingsBucket: true,
		subjects.ClustersBucket: true, subjects.NamespaceBindingsBucket: true}
	var ps []view.Projection
	for _, p := range slices.Concat(rbacsync.Projections(), clusterimport.Projections(), namespacebinding.Projections()) {
		if inputs[p.Bucket.Bucket] {
			ps = append(ps, p)
		}
	}
	if len(ps) != len(inputs) {
		t.Fatalf("found %d of the fan-out's %d input views", len(ps), len(inputs))
	}
	testkit.WaitProjected(t, e.js.JS, ps...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.svc.SyncFanout(ctx); err != nil {
		t.Fatalf("fan-out: %v", err)
	}
}

type mismatch struct{ key, got, want string }

func (m *mismatch) Error() string { return m.key + ": got " + m.got + ", want " + m.want }
