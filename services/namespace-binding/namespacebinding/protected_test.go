package namespacebinding_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/protectedns"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

func protectedList(t testing.TB, extra ...string) protectedns.List {
	t.Helper()
	l, err := protectedns.New(extra...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The attack: a project owner binds a namespace of the cluster's own (kube-system: its
// Secrets and controllers' ServiceAccounts), or the agent's, and so gets its project roles
// there. Every path that ends in a binding refuses it, naming the field, and writes nothing.
func TestProjectOwnerCannotBindAProtectedNamespace(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{Protected: protectedList(t, "agents", "infra-*")})
	e.register(t, "c1")
	e.connectAgents(t, "c1")
	e.createProject(t, "team-a")
	if _, err := e.bindSet("team-a", "global"); err != nil {
		t.Fatal(err)
	}
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "all"})
	e.eventuallyDecided(t, "team-a", "all", "c1")
	grantRole(t, e.js.JS, "team-a", roles.ProjectOwner)
	bob := projectv1connect.NewProjectServiceClient(testkit.BearerClient(e.http, viewerToken), e.url)
	ctx := testkit.Context(t, time.Minute)
	// bob owns team-a: an ordinary namespace binds (once the authorizer has seen the grant).
	testkit.Eventually(t, 10*time.Second, func() error {
		_, err := bob.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web"}))
		return err
	})

	for _, ns := range []string{"kube-system", "kube-public", "kube-node-lease", "default", "fleetstream", "fleetstream-agent", "agents", "infra-logs"} {
		t.Run(ns, func(t *testing.T) {
			for _, req := range []*projectv1.BindNamespaceRequest{
				{Project: "team-a", Cluster: "c1", Namespace: ns},
				{Project: "team-a", Namespace: ns, Placement: "all"},
			} {
				_, err := bob.BindNamespace(ctx, connect.NewRequest(req))
				if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("namespace: %q is protected", ns)) {
					t.Fatalf("bind %v: %v, want InvalidArgument naming the namespace as protected", req, err)
				}
			}
		})
	}
	// Nothing was claimed, bound, desired or recorded as following the placement.
	testkit.WaitProjected(t, e.js.JS, namespacebinding.Projections()...)
	for _, bucket := range []string{namespacebinding.ClaimsBucket, namespacebinding.BindingsBucket, subjects.DesiredNamespacesBucket, subjects.PlacementNamespacesBucket} {
		ks, err := e.kv(t, bucket).ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range ks.Keys() {
			if k != "=meta" && !strings.Contains(k, "web") {
				t.Errorf("bucket %s holds %s after refused binds", bucket, k)
			}
		}
	}
}

// Idle namespaces are what may be claimed: the protected ones never are, so they are never
// listed, and claiming one by name is refused like any bind.
func TestProtectedNamespacesAreNeverIdle(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{Protected: protectedList(t, "agents")})
	e.register(t, "c1")
	e.createProject(t, "team-a")
	ctx := testkit.Context(t, 30*time.Second)
	inv := &agentv1.NamespaceInventory{ClusterName: "c1", Namespaces: []*agentv1.Namespace{
		{Name: "default"}, {Name: "kube-system"}, {Name: "kube-public"}, {Name: "kube-node-lease"}, {Name: "agents"}, {Name: "web"},
	}}
	if _, err := events.NewStore(e.js.JS, "agent").Append(ctx, subjects.AgentInventory("c1"), "c1", events.Any, inv); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		res, err := e.client.ListIdleNamespaces(ctx, connect.NewRequest(&projectv1.ListIdleNamespacesRequest{Cluster: "c1"}))
		if err != nil {
			return err
		}
		var names []string
		for _, n := range res.Msg.Namespaces {
			names = append(names, n.Name)
		}
		if !slices.Equal(names, []string{"web"}) {
			return fmt.Errorf("idle %v, want [web]", names)
		}
		return nil
	})
	for _, ns := range []string{"kube-system", "agents"} {
		if _, err := e.bind("team-a", "c1", ns, nil); code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "namespace: ") {
			t.Fatalf("claim idle %s: %v, want InvalidArgument naming the namespace", ns, err)
		}
	}
}

// A namespace that followed a placement before it was protected (the list grew, or the hub
// was older) gets no new binding: the follower skips it and shows a Failed binding saying why.
func TestFollowerDoesNotBindANamespaceProtectedLater(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.connectAgents(t, "c1", "c2")
	e.labelCluster(t, "c1", "region", "eu")
	e.createProject(t, "team-a")
	if _, err := e.bindSet("team-a", "global"); err != nil {
		t.Fatal(err)
	}
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "eu", Predicates: []*placementv1.Predicate{predicate("region", "eu")}})
	e.eventuallyDecided(t, "team-a", "eu", "c1")
	if _, err := e.bindToPlacement("team-a", "infra", "eu", nil); err != nil {
		t.Fatal(err)
	}
	e.stop()

	e = start(t, j, namespacebinding.Config{Protected: protectedList(t, "infra")})
	e.connectAgents(t, "c1", "c2")
	e.labelCluster(t, "c2", "region", "eu")
	e.eventuallyDecided(t, "team-a", "eu", "c1", "c2")
	testkit.Eventually(t, 10*time.Second, func() error {
		if got, want := e.bindingsOf(t, "team-a", "infra"), []string{"c1:PENDING:eu", "c2:FAILED:eu"}; !slices.Equal(got, want) {
			return fmt.Errorf("infra bindings %v, want %v", got, want)
		}
		return nil
	})
	for _, b := range e.projectBindings(t, "team-a") {
		if b.Cluster == "c2" && (b.Reason != namespacebinding.ReasonProtectedNamespace || !strings.Contains(b.Message, `"infra" is protected`)) {
			t.Fatalf("c2's binding %v: want ProtectedNamespace", b)
		}
	}
	// Not merely shown: no binding is made, however many rounds the follower runs.
	e.scheduled(t)
	time.Sleep(time.Second)
	if _, ok := e.binding(t, "team-a", "c2", "infra"); ok {
		t.Fatal("the follower bound infra on c2")
	}
	if _, err := e.client.UnbindNamespace(context.Background(), connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Namespace: "infra", Placement: "eu"})); err != nil {
		t.Fatalf("unbinding what was bound before the protection: %v", err)
	}
}
