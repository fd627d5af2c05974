package fleetd_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// Issue 25 item 4 through fleetd, projects and bindings made with the API: team-a owns web on
// c1, team-b owns web on c2, both report web/api. team-a's weight of 1,000 on c1 leaves
// team-b's web/api (only c2) alone, and team-b's owner reads and weights its own service. Before,
// team-b's owner was refused (the read needed rights in every project owning "web") and the
// merged web/api gave team-a's pods ~91% of the traffic.
func TestProjectsOwningOneNamespaceNameHaveTheirOwnServices(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(apiToken+",admin\ntoken-alice,alice\ntoken-bob,bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inst, clusters := startFleetd(t, func(c *fleetd.Config) { c.Server.TokenFile = tokens })
	ctx := testkit.Context(t, 90*time.Second)
	base := "http://" + inst.Addr
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, base, connect.WithInterceptors(bearer(apiToken)))
	rbac := rbacv1connect.NewRBACServiceClient(http.DefaultClient, base, connect.WithInterceptors(bearer(apiToken)))
	for _, tc := range []struct{ cluster, project, owner string }{{"c1", "team-a", "alice"}, {"c2", "team-b", "bob"}} {
		if _, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: tc.cluster})); err != nil {
			t.Fatal(err)
		}
		if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: tc.project})); err != nil {
			t.Fatal(err)
		}
		if _, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: tc.project, Cluster: tc.cluster, Namespace: "web"})); err != nil {
			t.Fatal(err)
		}
		if _, err := rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: tc.project, RoleTemplate: roles.ProjectOwner,
			Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: tc.owner}})); err != nil {
			t.Fatal(err)
		}
		rep := &endpointv1.EndpointSliceReport{ClusterName: tc.cluster, Namespace: "web", Service: "api", Slice: "api-" + tc.cluster, AddressType: "IPv4",
			SessionId: "s1", Generation: 1, Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 8080, Protocol: "TCP"}},
			Endpoints: []*endpointv1.Endpoint{{Addresses: []string{"10.0." + tc.cluster[1:] + ".1"}, Ready: true, Serving: true}}}
		if _, err := events.NewStore(inst.JS, "agent").Append(ctx, subjects.AgentEndpointSlice(tc.cluster, "web", rep.Slice), tc.cluster, events.Any, rep); err != nil {
			t.Fatal(err)
		}
	}
	client := func(token string) endpointv1connect.EndpointServiceClient {
		return endpointv1connect.NewEndpointServiceClient(http.DefaultClient, base, connect.WithInterceptors(bearer(token)))
	}
	alice, bob := client("token-alice"), client("token-bob")
	served := func(c endpointv1connect.EndpointServiceClient) string {
		res, err := c.GetServiceEndpoints(ctx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{Namespace: "web", Name: "api"}))
		if err != nil {
			return connect.CodeOf(err).String()
		}
		out := ""
		for _, cl := range res.Msg.Clusters {
			for _, a := range cl.Addresses {
				out += fmt.Sprintf("%s:%s/w%d ", cl.ClusterName, a.Ip, a.Weight)
			}
		}
		return out
	}
	expect := func(who string, c endpointv1connect.EndpointServiceClient, want string) {
		t.Helper()
		testkit.Eventually(t, 20*time.Second, func() error {
			if got := served(c); got != want {
				return fmt.Errorf("%s reads web/api %q, want %q", who, got, want)
			}
			return nil
		})
	}
	expect("team-b's owner", bob, "c2:10.0.2.1/w100 ")
	expect("team-a's owner", alice, "c1:10.0.1.1/w100 ")

	if _, err := alice.SetClusterWeight(ctx, connect.NewRequest(&endpointv1.SetClusterWeightRequest{Namespace: "web", Name: "api", Cluster: "c1", Weight: 1000})); err != nil {
		t.Fatalf("team-a weights its cluster: %v", err)
	}
	expect("team-a's owner", alice, "c1:10.0.1.1/w1000 ")
	expect("team-b's owner", bob, "c2:10.0.2.1/w100 ")
	if _, err := bob.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{Namespace: "web", Name: "api", Ip: "10.0.2.1", Weight: 40})); err != nil {
		t.Fatalf("team-b weights its endpoint: %v", err)
	}
	expect("team-b's owner", bob, "c2:10.0.2.1/w40 ")
	expect("team-a's owner", alice, "c1:10.0.1.1/w1000 ")
}
