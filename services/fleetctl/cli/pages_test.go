package cli

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/paging"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// TestListsAndExportFollowEveryPage: with more project role bindings and namespace bindings
// than the server's default page (500), member list, namespace list and export show every one
// of them; a command that read only the first page would be short by the rest without a word.
func TestListsAndExportFollowEveryPage(t *testing.T) {
	h := startRBACHub(t)
	ctx := testkit.Context(t, 2*time.Minute)
	hc := testkit.BearerClient(http.DefaultClient, e2eToken)
	rbac := rbacv1connect.NewRBACServiceClient(hc, h.url)
	projects := projectv1connect.NewProjectServiceClient(hc, h.url)
	if _, err := clusterv1connect.NewClusterServiceClient(hc, h.url).RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	// The namespaces are another project's: in team-a each role binding would be written as
	// RoleBindings in every namespace, which is rbac-sync's work and not what this tests.
	for _, p := range []string{"team-a", "team-b"} {
		if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: p})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rbac.CreateRoleTemplate(ctx, connect.NewRequest(&rbacv1.CreateRoleTemplateRequest{Template: &rbacv1.RoleTemplate{Name: "reader",
		Rules: []*rbacv1.PolicyRule{{ApiGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}}})); err != nil {
		t.Fatal(err)
	}
	const n = paging.DefaultSize + 17
	began := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			if _, err := rbac.BindProjectRole(gctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "team-a", RoleTemplate: "reader",
				Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: fmt.Sprintf("u%04d", i)}})); err != nil {
				return fmt.Errorf("bind u%04d: %w", i, err)
			}
			if _, err := projects.BindNamespace(gctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-b", Cluster: "c1",
				Namespace: fmt.Sprintf("ns%04d", i)})); err != nil {
				return fmt.Errorf("bind ns%04d: %w", i, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d role bindings and namespace bindings made in %v", n, time.Since(began))
	began = time.Now()
	// The server does page: its first page is the default size.
	first, err := rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-a"}))
	if err != nil || len(first.Msg.Bindings) != paging.DefaultSize || first.Msg.NextPageToken == "" {
		t.Fatalf("first page: %d bindings, token %q, %v", len(first.Msg.Bindings), first.Msg.GetNextPageToken(), err)
	}

	members := jsonOf[[]struct {
		Subject struct{ Name string } `json:"subject"`
	}](t, h.run(t, "-o", "json", "member", "list", "team-a").ok(t))
	if len(members) != n || members[0].Subject.Name != "u0000" || members[n-1].Subject.Name != fmt.Sprintf("u%04d", n-1) {
		t.Fatalf("member list shows %d bindings, want %d", len(members), n)
	}
	namespaces := jsonOf[[]bindingJSON](t, h.run(t, "-o", "json", "namespace", "list", "--project", "team-b").ok(t))
	if len(namespaces) != n {
		t.Fatalf("namespace list shows %d bindings, want %d", len(namespaces), n)
	}
	t.Logf("lists in %v", time.Since(began))
	export := h.run(t, "export").ok(t).stdout
	for i := range n {
		if !strings.Contains(export, fmt.Sprintf("name: u%04d", i)) || !strings.Contains(export, fmt.Sprintf("name: ns%04d", i)) {
			t.Fatalf("export lacks u%04d or ns%04d", i, i)
		}
	}
}
