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

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/namespace-binding/placement"
)

var (
	exclusive = &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_EXCLUSIVE_LABEL}
	everyOne  = &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR, LabelSelector: &placementv1.LabelSelector{}}
)

func matchLabels(kv ...string) *placementv1.ClusterSetSelector {
	return &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR,
		LabelSelector: &placementv1.LabelSelector{MatchLabels: hard(kv...)}}
}

func (e *env) createSet(name string, sel *placementv1.ClusterSetSelector) (*placementv1.ClusterSet, error) {
	res, err := e.sets.CreateClusterSet(context.Background(), connect.NewRequest(&placementv1.CreateClusterSetRequest{Name: name, Selector: sel}))
	if err != nil {
		return nil, err
	}
	return res.Msg.ClusterSet, nil
}

func (e *env) getSet(t testing.TB, name string) *placementv1.ClusterSet {
	t.Helper()
	res, err := e.sets.GetClusterSet(context.Background(), connect.NewRequest(&placementv1.GetClusterSetRequest{Name: name}))
	if err != nil {
		t.Fatalf("get cluster set %s: %v", name, err)
	}
	return res.Msg.ClusterSet
}

func (e *env) listSets(t testing.TB) []*placementv1.ClusterSet {
	t.Helper()
	res, err := e.sets.ListClusterSets(context.Background(), connect.NewRequest(&placementv1.ListClusterSetsRequest{}))
	if err != nil {
		t.Fatalf("list cluster sets: %v", err)
	}
	return res.Msg.ClusterSets
}

func (e *env) bindSet(project, set string) (*placementv1.ClusterSetBinding, error) {
	res, err := e.sets.BindClusterSet(context.Background(), connect.NewRequest(&placementv1.BindClusterSetRequest{Project: project, ClusterSet: set}))
	if err != nil {
		return nil, err
	}
	return res.Msg.Binding, nil
}

func listSetBindings(c placementv1connect.ClusterSetServiceClient, project string) ([]*placementv1.ClusterSetBinding, error) {
	res, err := c.ListClusterSetBindings(context.Background(), connect.NewRequest(&placementv1.ListClusterSetBindingsRequest{Project: project}))
	if err != nil {
		return nil, err
	}
	return res.Msg.Bindings, nil
}

func (e *env) setClusterLabels(t testing.TB, cluster string, labels map[string]string) {
	t.Helper()
	if _, err := e.clusters.UpdateCluster(context.Background(), connect.NewRequest(&clusterv1.UpdateClusterRequest{
		Name: cluster, Labels: labels, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})); err != nil {
		t.Fatalf("label cluster %s: %v", cluster, err)
	}
}

// eventuallyMembers waits until set's members are want: membership is computed from the
// registry view, which follows cluster-import's changes a moment after they are answered.
func (e *env) eventuallyMembers(t testing.TB, set string, want ...string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() error {
		got := e.getSet(t, set).GetStatus()
		if !slices.Equal(got.GetMembers(), want) || int(got.GetMemberCount()) != len(want) {
			return fmt.Errorf("set %s has members %v (count %d), want %v", set, got.GetMembers(), got.GetMemberCount(), want)
		}
		return nil
	})
}

func setNames(sets []*placementv1.ClusterSet) []string {
	out := make([]string, len(sets))
	for i, s := range sets {
		out[i] = s.Name
	}
	return out
}

func TestClusterSetLifecycleAndMembership(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	// Built in from the start: default (exclusive label) and global (empty label selector).
	sets := e.listSets(t)
	if got := setNames(sets); !slices.Equal(got, []string{"default", "global"}) {
		t.Fatalf("sets at start %v, want default and global", got)
	}
	if !proto.Equal(sets[0].Selector, exclusive) || !proto.Equal(sets[1].Selector, everyOne) {
		t.Fatalf("built-in selectors %v, %v", sets[0].Selector, sets[1].Selector)
	}

	e.register(t, "c1", "c2", "c3")
	e.eventuallyMembers(t, "default", "c1", "c2", "c3")
	e.eventuallyMembers(t, "global", "c1", "c2", "c3")

	eu, err := e.createSet("eu", nil) // no selector: OCM's default, the exclusive label
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(eu.Selector, exclusive) || eu.Status.GetMemberCount() != 0 || eu.Revision == 0 {
		t.Fatalf("created %v", eu)
	}
	if _, err := e.createSet("prod", matchLabels("env", "prod")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.createSet("none", &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR}); err != nil {
		t.Fatal(err)
	}

	// Membership follows the clusters' labels.
	e.setClusterLabels(t, "c1", map[string]string{"fleetstream.io/clusterset": "eu"})
	e.setClusterLabels(t, "c2", map[string]string{"env": "prod"})
	e.eventuallyMembers(t, "eu", "c1")
	e.eventuallyMembers(t, "default", "c2", "c3")
	e.eventuallyMembers(t, "prod", "c2")
	e.eventuallyMembers(t, "none")
	e.eventuallyMembers(t, "global", "c1", "c2", "c3")
	e.setClusterLabels(t, "c1", map[string]string{"fleetstream.io/clusterset": "", "env": "prod"}) // back to default
	e.eventuallyMembers(t, "eu")
	e.eventuallyMembers(t, "default", "c1", "c2", "c3")
	e.eventuallyMembers(t, "prod", "c1", "c2")
	counts := map[string]int32{}
	for _, s := range e.listSets(t) {
		counts[s.Name] = s.Status.GetMemberCount()
		if len(s.Status.GetMembers()) != 0 {
			t.Errorf("list carries members of %s", s.Name)
		}
	}
	if want := map[string]int32{"default": 3, "global": 3, "eu": 0, "prod": 2, "none": 0}; fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Fatalf("member counts %v, want %v", counts, want)
	}

	// Duplicates, built-ins.
	for _, name := range []string{"eu", "default", "global"} {
		if _, err := e.createSet(name, nil); code(err) != connect.CodeAlreadyExists {
			t.Errorf("create %s again: %v", name, err)
		}
	}
	for _, name := range []string{"default", "global"} {
		if _, err := e.sets.DeleteClusterSet(context.Background(), connect.NewRequest(&placementv1.DeleteClusterSetRequest{Name: name})); code(err) != connect.CodeFailedPrecondition {
			t.Errorf("delete built-in %s: %v", name, err)
		}
		if _, err := e.sets.UpdateClusterSet(context.Background(), connect.NewRequest(&placementv1.UpdateClusterSetRequest{Name: name, Selector: matchLabels("a", "b")})); code(err) != connect.CodeFailedPrecondition {
			t.Errorf("update built-in %s: %v", name, err)
		}
	}

	// Update with and without an expectation.
	prod := e.getSet(t, "prod")
	if _, err := e.sets.UpdateClusterSet(context.Background(), connect.NewRequest(&placementv1.UpdateClusterSetRequest{
		Name: "prod", Selector: matchLabels("env", "staging"), ExpectedRevision: prod.Revision + 1000})); code(err) != connect.CodeAborted {
		t.Fatalf("update at a stale revision: %v", err)
	}
	res, err := e.sets.UpdateClusterSet(context.Background(), connect.NewRequest(&placementv1.UpdateClusterSetRequest{
		Name: "prod", Selector: matchLabels("env", "staging"), ExpectedRevision: prod.Revision}))
	if err != nil {
		t.Fatal(err)
	}
	if up := res.Msg.ClusterSet; up.Revision <= prod.Revision || !proto.Equal(up.Selector, matchLabels("env", "staging")) || up.Status.GetMemberCount() != 0 {
		t.Fatalf("updated %v", up)
	}
	if _, err := e.sets.UpdateClusterSet(context.Background(), connect.NewRequest(&placementv1.UpdateClusterSetRequest{Name: "ghost", Selector: exclusive})); code(err) != connect.CodeNotFound {
		t.Fatalf("update of a missing set: %v", err)
	}

	// Delete, then create the name again over the deleted aggregate.
	if _, err := e.sets.DeleteClusterSet(context.Background(), connect.NewRequest(&placementv1.DeleteClusterSetRequest{Name: "prod"})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sets.GetClusterSet(context.Background(), connect.NewRequest(&placementv1.GetClusterSetRequest{Name: "prod"})); code(err) != connect.CodeNotFound {
		t.Fatalf("get after delete: %v", err)
	}
	if _, err := e.sets.DeleteClusterSet(context.Background(), connect.NewRequest(&placementv1.DeleteClusterSetRequest{Name: "prod"})); code(err) != connect.CodeNotFound {
		t.Fatalf("delete twice: %v", err)
	}
	again, err := e.createSet("prod", matchLabels("env", "prod"))
	if err != nil {
		t.Fatalf("create over a deleted set: %v", err)
	}
	if again.Status.GetMemberCount() != 2 {
		t.Fatalf("recreated %v", again)
	}
}

func TestClusterSetValidationNamesTheField(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	for _, tc := range []struct {
		name  string
		set   string
		sel   *placementv1.ClusterSetSelector
		field string
	}{
		{"bad name", "Not_A_Name", nil, "name"},
		{"bad operator", "s", &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR,
			LabelSelector: &placementv1.LabelSelector{MatchExpressions: []*placementv1.LabelSelectorRequirement{{Key: "env", Operator: "Near"}}}}, "selector.label_selector"},
		{"bad label key", "s", matchLabels("not a key", "x"), "selector.label_selector"},
		{"In without values", "s", &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR,
			LabelSelector: &placementv1.LabelSelector{MatchExpressions: []*placementv1.LabelSelectorRequirement{{Key: "env", Operator: "In"}}}}, "selector.label_selector"},
		{"selector on an exclusive set", "s", &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_EXCLUSIVE_LABEL,
			LabelSelector: &placementv1.LabelSelector{}}, "selector.label_selector"},
		{"unknown type", "s", &placementv1.ClusterSetSelector{Type: 9}, "selector.type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.createSet(tc.set, tc.sel)
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field+": ") {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	if _, err := e.sets.UpdateClusterSet(context.Background(), connect.NewRequest(&placementv1.UpdateClusterSetRequest{Name: "s"})); code(err) != connect.CodeInvalidArgument ||
		!strings.Contains(err.Error(), "selector: ") {
		t.Fatalf("update without a selector: %v", err)
	}
	if got := setNames(e.listSets(t)); !slices.Equal(got, []string{"default", "global"}) {
		t.Fatalf("invalid requests wrote sets: %v", got)
	}
}

func TestConcurrentClusterSetCreationsExactlyOneWins(t *testing.T) {
	j := testkit.StartJetStream(t)
	// Two replicas of the service on one JetStream, as in production.
	e1 := start(t, j, namespacebinding.Config{})
	e2 := start(t, j, namespacebinding.Config{})
	testkit.OneWins(t, 8, connect.CodeAlreadyExists, func(i int) error {
		e := e1
		if i%2 == 1 {
			e = e2
		}
		_, err := e.createSet("race", matchLabels("writer", fmt.Sprint(i)))
		return err
	})
	// Both replicas agree on the winner, and the built-ins were written once.
	testkit.Eventually(t, 5*time.Second, func() error {
		a, b := e1.getSet(t, "race"), e2.getSet(t, "race")
		if !proto.Equal(a, b) {
			return fmt.Errorf("replicas disagree: %v vs %v", a, b)
		}
		return nil
	})
	for _, name := range []string{"default", "global"} {
		if n := countEvents(t, j.JS, subjects.ClusterSet(name)); n != 1 {
			t.Errorf("%d events on built-in %s, want 1", n, name)
		}
	}
}

// countEvents counts the messages on subject of FLEET_PLACEMENT.
func countEvents(t testing.TB, js jetstream.JetStream, subject string) int {
	t.Helper()
	s, err := js.Stream(context.Background(), namespacebinding.PlacementStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return int(info.State.Subjects[subject])
}

// grantViewer makes bob a project-viewer of project the way rbac-sync's views would say it;
// this harness runs no rbac-sync, so the authorizer's buckets are written directly.
func grantViewer(t testing.TB, js jetstream.JetStream, project string) {
	t.Helper()
	grantRole(t, js, project, roles.ProjectViewer)
}

// grantRole gives bob the built-in role template in project, as rbac-sync's buckets record it.
func grantRole(t testing.TB, js jetstream.JetStream, project, template string) {
	t.Helper()
	ctx := context.Background()
	open := func(bucket string) jetstream.KeyValue {
		kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	put := func(kv jetstream.KeyValue, key string, m proto.Message) {
		data, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	templates, bindings := open(subjects.RBACTemplatesBucket), open(subjects.RBACBindingsBucket)
	for _, b := range roles.Builtin() {
		put(templates, keys.Encode(b.Name), b)
	}
	put(bindings, keys.Join(project, "bob"), &rbacv1.ProjectRoleBinding{Project: project, RoleTemplate: template,
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "bob"}})
}

func bindingPairs(bs []*placementv1.ClusterSetBinding) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = fmt.Sprintf("%s/%s:%v", b.Project, b.ClusterSet, b.Status.GetClusterSetExists())
	}
	return out
}

func TestClusterSetBindings(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.createProject(t, "team-a", "team-b")
	if _, err := e.createSet("eu", nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{"team-a", "default"}, {"team-a", "eu"}, {"team-a", "later"}, {"team-b", "global"}} {
		b, err := e.bindSet(p[0], p[1])
		if err != nil {
			t.Fatalf("bind %v: %v", p, err)
		}
		if b.Revision == 0 || b.Project != p[0] || b.ClusterSet != p[1] {
			t.Fatalf("bound %v", b)
		}
	}
	if _, err := e.bindSet("team-a", "eu"); code(err) != connect.CodeAlreadyExists {
		t.Fatalf("bind twice: %v", err)
	}
	if _, err := e.bindSet("no-such-project", "eu"); code(err) != connect.CodeNotFound {
		t.Fatalf("bind to a missing project: %v", err)
	}
	if _, err := e.bindSet("team-a", "Bad_Set"); code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "cluster_set: ") {
		t.Fatalf("bind an invalid name: %v", err)
	}

	all, err := listSetBindings(e.sets, "")
	if err != nil {
		t.Fatal(err)
	}
	// A binding of a set that does not exist is kept, and says so (OCM's behaviour).
	if got, want := bindingPairs(all), []string{"team-a/default:true", "team-a/eu:true", "team-a/later:false", "team-b/global:true"}; !slices.Equal(got, want) {
		t.Fatalf("bindings %v, want %v", got, want)
	}
	if _, err := e.createSet("later", nil); err != nil {
		t.Fatal(err)
	}
	teamA, err := listSetBindings(e.sets, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := bindingPairs(teamA), []string{"team-a/default:true", "team-a/eu:true", "team-a/later:true"}; !slices.Equal(got, want) {
		t.Fatalf("team-a's bindings %v, want %v", got, want)
	}

	// A project viewer sees its project's bindings only, and may change nothing.
	grantViewer(t, e.js.JS, "team-a")
	bob := placementv1connect.NewClusterSetServiceClient(testkit.BearerClient(e.http, viewerToken), e.url)
	testkit.Eventually(t, 10*time.Second, func() error {
		got, err := listSetBindings(bob, "")
		if err != nil {
			return err
		}
		if want := []string{"team-a/default:true", "team-a/eu:true", "team-a/later:true"}; !slices.Equal(bindingPairs(got), want) {
			return fmt.Errorf("bob sees %v, want %v", bindingPairs(got), want)
		}
		return nil
	})
	if _, err := listSetBindings(bob, "team-b"); code(err) != connect.CodePermissionDenied {
		t.Fatalf("bob lists team-b's bindings: %v", err)
	}
	if _, err := bob.ListClusterSets(context.Background(), connect.NewRequest(&placementv1.ListClusterSetsRequest{})); err != nil {
		t.Fatalf("bob lists sets: %v", err)
	}
	if _, err := bob.BindClusterSet(context.Background(), connect.NewRequest(&placementv1.BindClusterSetRequest{Project: "team-a", ClusterSet: "global"})); code(err) != connect.CodePermissionDenied {
		t.Fatalf("bob binds: %v", err)
	}
	if _, err := bob.CreateClusterSet(context.Background(), connect.NewRequest(&placementv1.CreateClusterSetRequest{Name: "mine"})); code(err) != connect.CodePermissionDenied {
		t.Fatalf("bob creates a set: %v", err)
	}

	// Unbind, unbind again, bind again.
	unbind := func(project, set string) error {
		_, err := e.sets.UnbindClusterSet(context.Background(), connect.NewRequest(&placementv1.UnbindClusterSetRequest{Project: project, ClusterSet: set}))
		return err
	}
	if err := unbind("team-a", "eu"); err != nil {
		t.Fatal(err)
	}
	if err := unbind("team-a", "eu"); code(err) != connect.CodeNotFound {
		t.Fatalf("unbind twice: %v", err)
	}
	teamA, _ = listSetBindings(e.sets, "team-a")
	if got, want := bindingPairs(teamA), []string{"team-a/default:true", "team-a/later:true"}; !slices.Equal(got, want) {
		t.Fatalf("after unbind %v, want %v", got, want)
	}
	if _, err := e.bindSet("team-a", "eu"); err != nil {
		t.Fatalf("bind after unbind: %v", err)
	}
}

func TestClusterSetsSurviveRestartAndRebuild(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a")
	if _, err := e.createSet("eu", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.createSet("prod", matchLabels("env", "prod")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.createSet("gone", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.sets.DeleteClusterSet(context.Background(), connect.NewRequest(&placementv1.DeleteClusterSetRequest{Name: "gone"})); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"eu", "global", "gone"} {
		if _, err := e.bindSet("team-a", s); err != nil {
			t.Fatal(err)
		}
	}
	e.setClusterLabels(t, "c1", map[string]string{"fleetstream.io/clusterset": "eu", "env": "prod"})
	e.eventuallyMembers(t, "eu", "c1")
	for _, name := range []string{"zed", "amy"} {
		if _, err := e.sets.BindClusterSetRole(context.Background(), connect.NewRequest(&placementv1.BindClusterSetRoleRequest{
			ClusterSet: "eu", Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: name}, Role: roles.ClusterSetView})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.sets.UnbindClusterSetRole(context.Background(), connect.NewRequest(&placementv1.UnbindClusterSetRoleRequest{
		ClusterSet: "eu", Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "amy"}, Role: roles.ClusterSetView})); err != nil {
		t.Fatal(err)
	}
	listRoles := func(c placementv1connect.ClusterSetServiceClient) []*placementv1.ClusterSetRoleBinding {
		t.Helper()
		res, err := c.ListClusterSetRoleBindings(context.Background(), connect.NewRequest(&placementv1.ListClusterSetRoleBindingsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.Bindings
	}
	beforeRoles := listRoles(e.sets)
	if len(beforeRoles) != 1 || beforeRoles[0].GetSubject().GetName() != "zed" || beforeRoles[0].Creator != "alice" {
		t.Fatalf("set roles: %v, want zed's, bound by alice", beforeRoles)
	}
	beforeSets := e.listSets(t)
	beforeBindings, err := listSetBindings(e.sets, "")
	if err != nil {
		t.Fatal(err)
	}
	e.stop()

	for _, tc := range []struct {
		name       string
		dropBucket bool
	}{{"restart", false}, {"rebuild from the stream", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.dropBucket {
				for _, b := range []string{placement.ClusterSetsBucket, placement.ClusterSetBindingsBucket, placement.ClusterSetRolesBucket} {
					if err := j.JS.DeleteKeyValue(context.Background(), b); err != nil {
						t.Fatal(err)
					}
				}
			}
			e2 := start(t, j, namespacebinding.Config{})
			defer e2.stop()
			afterSets := e2.listSets(t)
			if len(afterSets) != len(beforeSets) {
				t.Fatalf("sets after %s: %v, want %v", tc.name, setNames(afterSets), setNames(beforeSets))
			}
			for i := range afterSets {
				if !proto.Equal(afterSets[i], beforeSets[i]) {
					t.Fatalf("set after %s:\n%v\nwant\n%v", tc.name, afterSets[i], beforeSets[i])
				}
			}
			afterBindings, err := listSetBindings(e2.sets, "")
			if err != nil {
				t.Fatal(err)
			}
			if len(afterBindings) != len(beforeBindings) {
				t.Fatalf("bindings after %s: %v, want %v", tc.name, bindingPairs(afterBindings), bindingPairs(beforeBindings))
			}
			for i := range afterBindings {
				if !proto.Equal(afterBindings[i], beforeBindings[i]) {
					t.Fatalf("binding after %s:\n%v\nwant\n%v", tc.name, afterBindings[i], beforeBindings[i])
				}
			}
			if afterRoles := listRoles(e2.sets); len(afterRoles) != 1 || !proto.Equal(afterRoles[0], beforeRoles[0]) {
				t.Fatalf("set roles after %s: %v, want %v", tc.name, afterRoles, beforeRoles)
			}
			// The built-ins are not written again on a restart.
			for _, name := range []string{"default", "global"} {
				if n := countEvents(t, j.JS, subjects.ClusterSet(name)); n != 1 {
					t.Errorf("%d events on built-in %s after %s, want 1", n, name, tc.name)
				}
			}
		})
	}
}
