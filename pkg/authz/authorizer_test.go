package authz_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/authz"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

func put(t *testing.T, kv jetstream.KeyValue, key string, m proto.Message) {
	t.Helper()
	data, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), key, data); err != nil {
		t.Fatal(err)
	}
}

// The views an authorizer reads belong to other services, which may create them after it
// starts, and rebuild them (delete and recreate the bucket) when their projection changes.
// The authorizer follows all of it without stopping.
func TestAuthorizerFollowsViewsCreatedLateAndRebuilt(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	az := authz.New(j.JS, authz.Config{PlatformAdmins: []string{"root"}}, testkit.Logger(t))
	errc := make(chan error, 1)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { errc <- az.Run(runCtx) }()
	select {
	case <-az.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not ready without any view")
	}
	alice := az.CallerFor("alice", []string{"devs"})
	if !az.CallerFor("root", nil).Can("create", roles.Group, roles.ResProjects, "") || alice.Can("get", roles.Group, roles.ResProjects, "team-a") {
		t.Fatal("wrong answers before any view exists")
	}
	create := func(bucket string) jetstream.KeyValue {
		kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	templates, bindings, nsb := create(subjects.RBACTemplatesBucket), create(subjects.RBACBindingsBucket), create(subjects.NamespaceBindingsBucket)
	for _, b := range roles.Builtin() {
		put(t, templates, keys.Encode(b.Name), b)
	}
	put(t, bindings, "b1", &rbacv1.ProjectRoleBinding{Project: "team-a", RoleTemplate: roles.ProjectViewer,
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_GROUP, Name: "devs"}})
	put(t, nsb, keys.Join("c1", "web"), &projectv1.NamespaceBinding{Project: "team-a", Cluster: "c1", Namespace: "web"})
	testkit.Eventually(t, 10*time.Second, func() error {
		if !alice.Can("get", roles.Group, roles.ResProjects, "team-a") || !alice.CanInNamespace("get", roles.Group, roles.ResServices, "c1", "web") {
			return errContext("the grant through a group is not seen")
		}
		return nil
	})
	if alice.Can("update", roles.Group, roles.ResServiceWeights, "team-a") || alice.CanInNamespace("get", roles.Group, roles.ResServices, "c2", "web") {
		t.Fatal("a viewer got more than it was granted")
	}
	// The owner rebuilds its view: the bucket goes and comes back with other content.
	if err := j.JS.DeleteKeyValue(ctx, subjects.RBACBindingsBucket); err != nil {
		t.Fatal(err)
	}
	bindings = create(subjects.RBACBindingsBucket)
	put(t, bindings, "b2", &rbacv1.ProjectRoleBinding{Project: "team-b", RoleTemplate: roles.ProjectOwner,
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}})
	testkit.Eventually(t, 15*time.Second, func() error {
		if alice.Can("get", roles.Group, roles.ResProjects, "team-a") || !alice.Can("create", roles.Group, roles.ResNamespaceBindings, "team-b") {
			return errContext("the rebuilt view is not followed")
		}
		return nil
	})
	select {
	case err := <-errc:
		t.Fatalf("authorizer stopped: %v", err)
	default:
	}
}

type errContext string

func (e errContext) Error() string { return string(e) }
