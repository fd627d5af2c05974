package rbacsync_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1k "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// member is a real member cluster (etcd + kube-apiserver with RBAC) and its agent's desired
// applier, running in-process against the hub's JetStream, which can be stopped and started
// again to play an agent outage.
type member struct {
	name string
	kube *testkit.Kube
	e    *env

	mu   sync.Mutex
	stop func()
}

func startMember(t *testing.T, e *env, name string) *member { return startMemberTB(t, e, name) }

func startMemberTB(t testing.TB, e *env, name string) *member {
	t.Helper()
	m := &member{name: name, kube: testkit.StartKube(t), e: e}
	e.register(t, name)
	m.start(t)
	t.Cleanup(m.down)
	return m
}

// start runs the cluster's desired applier (the agent's half that applies desired state).
func (m *member) start(t testing.TB) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(m.kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	a, err := desired.New(desired.Config{ClusterName: m.name, ResyncPeriod: time.Minute, Workers: 16}, m.e.js.JS, dyn, m.kube.Client.Discovery(), testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Run(ctx); err != nil {
			t.Errorf("applier of %s: %v", m.name, err)
		}
	}()
	m.mu.Lock()
	m.stop = func() { cancel(); <-done }
	m.mu.Unlock()
}

// down stops the applier: the cluster no longer hears from the hub.
func (m *member) down() {
	m.mu.Lock()
	stop := m.stop
	m.stop = nil
	m.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// access is one `kubectl auth can-i --as` question.
type access struct {
	user string
	// inGroup is a group the user is in ("" for none).
	inGroup   string
	verb      string
	apiGroup  string
	resource  string
	namespace string
}

func can(user, verb, resource, namespace string) access {
	return access{user: user, verb: verb, resource: resource, namespace: namespace}
}

// allowed asks the member's kube-apiserver with a SubjectAccessReview.
func (m *member) allowed(ctx context.Context, a access) (bool, error) {
	var groups []string
	if a.inGroup != "" {
		groups = []string{a.inGroup}
	}
	sar, err := m.kube.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: a.user, Groups: groups, ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: a.namespace, Verb: a.verb, Group: a.apiGroup, Resource: a.resource}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("subject access review on %s: %w", m.name, err)
	}
	return sar.Status.Allowed, nil
}

// expect waits until every member answers each question as wanted.
func expect(t *testing.T, d time.Duration, want map[*member]map[access]bool) {
	t.Helper()
	ctx := testkit.Context(t, d+10*time.Second)
	testkit.Eventually(t, d, func() error {
		for m, qs := range want {
			for q, w := range qs {
				got, err := m.allowed(ctx, q)
				if err != nil {
					return err
				}
				if got != w {
					return fmt.Errorf("%s: can %s (group %q) %s %s in %s = %v, want %v", m.name, q.user, q.inGroup, q.verb, q.resource, q.namespace, got, w)
				}
			}
		}
		return nil
	})
}

const converge = 60 * time.Second

// TestFlowsOnRealClusters checks each flow of the spec with SubjectAccessReview against real
// kube-apiservers, including the same namespace name on two clusters owned by two projects.
func TestFlowsOnRealClusters(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiservers")
	}
	e := start(t, nil, rbacsync.Config{})
	c1, c2 := startMember(t, e, "c1"), startMember(t, e, "c2")
	e.createProject(t, "team-a", "team-b")
	// "web" on c1 is team-a's, "web" on c2 is team-b's.
	e.bindNS(t, "team-a", "c1", "web")
	e.bindNS(t, "team-b", "c2", "web")

	// Flow 1 and 2: templates become ClusterRoles everywhere; bindings become RoleBindings.
	e.createTemplate(t, "pod-reader", nil, rule("", "pods", "get", "list"))
	e.createTemplate(t, "pod-editor", []string{"pod-reader"}, rule("", "pods", "update"))
	e.bindRole(t, "team-a", user("alice"), "pod-editor")
	e.bindRole(t, "team-b", user("bob"), "pod-reader")
	e.bindRole(t, "team-b", &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_GROUP, Name: "auditors"}, "pod-reader")
	sa := &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT, Namespace: "ci", Name: "deployer"}
	e.bindRole(t, "team-a", sa, "pod-reader")
	auditor := access{user: "eve", inGroup: "auditors", verb: "list", resource: "pods", namespace: "web"}
	saList := can("system:serviceaccount:ci:deployer", "list", "pods", "web")
	expect(t, converge, map[*member]map[access]bool{
		c1: {can("alice", "update", "pods", "web"): true, can("alice", "list", "pods", "web"): true, can("alice", "delete", "pods", "web"): false,
			can("bob", "list", "pods", "web"): false, auditor: false, saList: true, can("alice", "list", "pods", "default"): false},
		c2: {can("alice", "list", "pods", "web"): false, can("bob", "list", "pods", "web"): true, can("bob", "update", "pods", "web"): false,
			auditor: true, saList: false},
	})
	for _, m := range []*member{c1, c2} {
		if _, err := m.kube.Client.RbacV1().ClusterRoles().Get(bg(), "fleetstream:pod-editor", metav1.GetOptions{}); err != nil {
			t.Fatalf("ClusterRole on %s: %v", m.name, err)
		}
	}

	// Flow 6 (changed): a rule added to a parent reaches its heirs on every cluster.
	if _, err := e.rbac.UpdateRoleTemplate(bg(), connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{
		Template:   &rbacv1.RoleTemplate{Name: "pod-reader", Rules: []*rbacv1.PolicyRule{rule("", "pods", "get", "list"), rule("", "services", "get")}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rules"}},
	})); err != nil {
		t.Fatal(err)
	}
	expect(t, converge, map[*member]map[access]bool{
		c1: {can("alice", "get", "services", "web"): true},
		c2: {can("bob", "get", "services", "web"): true},
	})

	// Flow 3: a namespace bound later gets the project's RoleBindings.
	e.bindNS(t, "team-a", "c2", "api")
	expect(t, converge, map[*member]map[access]bool{c2: {can("alice", "update", "pods", "api"): true, can("bob", "list", "pods", "api"): false}})

	// Flow 4: a removed binding revokes everywhere.
	e.unbindRole(t, "team-a", user("alice"), "pod-editor")
	expect(t, converge, map[*member]map[access]bool{
		c1: {can("alice", "list", "pods", "web"): false, saList: true},
		c2: {can("alice", "list", "pods", "api"): false},
	})

	// Flow 5: an unbound namespace loses the project's RoleBindings.
	e.unbindNS(t, "team-b", "c2", "web")
	expect(t, converge, map[*member]map[access]bool{c2: {can("bob", "list", "pods", "web"): false, auditor: false}})

	// Flow 6 (removed): the template's ClusterRole and RoleBindings go.
	e.unbindRole(t, "team-a", sa, "pod-reader")
	if _, err := e.rbac.DeleteRoleTemplate(bg(), connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: "pod-editor"})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, converge, func() error {
		for _, m := range []*member{c1, c2} {
			if _, err := m.kube.Client.RbacV1().ClusterRoles().Get(bg(), "fleetstream:pod-editor", metav1.GetOptions{}); err == nil {
				return fmt.Errorf("ClusterRole fleetstream:pod-editor still on %s", m.name)
			}
		}
		return nil
	})
}

// TestRevocationWhileAgentIsDown: a binding removed and a template deleted while a cluster's
// agent is offline are applied when it returns, because removal is a tombstone the agent
// replays.
func TestRevocationWhileAgentIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiservers")
	}
	e := start(t, nil, rbacsync.Config{})
	c1 := startMember(t, e, "c1")
	e.createProject(t, "team-a")
	e.bindNS(t, "team-a", "c1", "web")
	e.createTemplate(t, "pod-reader", nil, rule("", "pods", "get"))
	e.createTemplate(t, "secret-reader", nil, rule("", "secrets", "get"))
	e.bindRole(t, "team-a", user("alice"), "pod-reader")
	e.bindRole(t, "team-a", user("bob"), "secret-reader")
	expect(t, converge, map[*member]map[access]bool{c1: {can("alice", "get", "pods", "web"): true, can("bob", "get", "secrets", "web"): true}})

	c1.down()
	e.unbindRole(t, "team-a", user("alice"), "pod-reader")
	e.unbindRole(t, "team-a", user("bob"), "secret-reader")
	if _, err := e.rbac.DeleteRoleTemplate(bg(), connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: "secret-reader"})); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, rbKey("c1", "web", "pod-reader"), "tombstone")
	// Nobody applied it: the grant is still live on the cluster.
	expect(t, 5*time.Second, map[*member]map[access]bool{c1: {can("alice", "get", "pods", "web"): true}})

	c1.start(t)
	expect(t, converge, map[*member]map[access]bool{c1: {can("alice", "get", "pods", "web"): false, can("bob", "get", "secrets", "web"): false}})
	testkit.Eventually(t, converge, func() error {
		if _, err := c1.kube.Client.RbacV1().ClusterRoles().Get(bg(), "fleetstream:secret-reader", metav1.GetOptions{}); err == nil {
			return fmt.Errorf("ClusterRole fleetstream:secret-reader still there")
		}
		return nil
	})
}

// TestDriftIsRepaired: RoleBindings and ClusterRoles deleted or edited by hand come back as
// desired.
func TestDriftIsRepaired(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiservers")
	}
	e := start(t, nil, rbacsync.Config{})
	c1 := startMember(t, e, "c1")
	e.createProject(t, "team-a")
	e.bindNS(t, "team-a", "c1", "web")
	e.createTemplate(t, "pod-reader", nil, rule("", "pods", "get"))
	e.bindRole(t, "team-a", user("alice"), "pod-reader")
	alice := can("alice", "get", "pods", "web")
	mallory := can("mallory", "get", "pods", "web")
	expect(t, converge, map[*member]map[access]bool{c1: {alice: true}})
	rbs := c1.kube.Client.RbacV1().RoleBindings("web")
	crs := c1.kube.Client.RbacV1().ClusterRoles()

	cases := []struct {
		name  string
		drift func(t *testing.T)
		check map[access]bool
	}{
		{"RoleBinding deleted", func(t *testing.T) {
			if err := rbs.Delete(bg(), "fleetstream:pod-reader", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, map[access]bool{alice: true}},
		{"subject added to the RoleBinding", func(t *testing.T) {
			rb, err := rbs.Get(bg(), "fleetstream:pod-reader", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			rb.Subjects = append(rb.Subjects, rbacv1k.Subject{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "mallory"})
			if _, err := rbs.Update(bg(), rb, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}, map[access]bool{alice: true, mallory: false}},
		{"ClusterRole rules emptied", func(t *testing.T) {
			cr, err := crs.Get(bg(), "fleetstream:pod-reader", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cr.Rules = nil
			if _, err := crs.Update(bg(), cr, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}, map[access]bool{alice: true}},
		{"ClusterRole deleted", func(t *testing.T) {
			if err := crs.Delete(bg(), "fleetstream:pod-reader", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, map[access]bool{alice: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.drift(t)
			expect(t, converge, map[*member]map[access]bool{c1: tc.check})
			// The repair is the desired object, not something the agent invented. Waited for:
			// the authorizer's cache lags the API, so the access check above can pass before
			// the drift has even been seen.
			testkit.Eventually(t, converge, func() error {
				rb, err := rbs.Get(bg(), "fleetstream:pod-reader", metav1.GetOptions{})
				if err != nil || len(rb.Subjects) != 1 || rb.Subjects[0].Name != "alice" {
					return fmt.Errorf("RoleBinding after repair: %v %v", rb, err)
				}
				return nil
			})
			testkit.Eventually(t, converge, func() error {
				cr, err := crs.Get(bg(), "fleetstream:pod-reader", metav1.GetOptions{})
				if err != nil || len(cr.Rules) != 1 || cr.Rules[0].Resources[0] != "pods" {
					return fmt.Errorf("ClusterRole after repair: %v %v", cr, err)
				}
				return nil
			})
		})
	}
}
