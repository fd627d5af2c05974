package namespacebinding_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

// pageBindings lists with req (its page_size set), calling between(i) after page i, and
// returns "project/cluster/namespace" of every binding of every page in order, and each page's
// length.
func pageBindings(t *testing.T, c projectv1connect.ProjectServiceClient, req *projectv1.ListNamespaceBindingsRequest, between func(page int)) ([]string, []int) {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	var ids []string
	var sizes []int
	for page := 0; ; page++ {
		res, err := c.ListNamespaceBindings(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		for _, b := range res.Msg.Bindings {
			ids = append(ids, b.Project+"/"+b.Cluster+"/"+b.Namespace)
		}
		sizes = append(sizes, len(res.Msg.Bindings))
		if res.Msg.NextPageToken == "" {
			return ids, sizes
		}
		if page > 100 {
			t.Fatal("paging does not end")
		}
		req.PageToken = res.Msg.NextPageToken
		if between != nil {
			between(page)
		}
	}
}

// byClusterNamespace sorts ids as the server pages them: by cluster, then namespace.
func byClusterNamespace(ids []string) {
	slices.SortFunc(ids, func(a, b string) int {
		pa, pb := strings.SplitN(a, "/", 2), strings.SplitN(b, "/", 2)
		return strings.Compare(pa[1], pb[1])
	})
}

// TestListNamespaceBindingsPages: paging through a cluster's bindings and a project's (across
// clusters) sees each binding that exists throughout exactly once, in (cluster, namespace)
// order, while namespaces are bound and unbound between pages.
func TestListNamespaceBindingsPages(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a", "team-b")
	var onC1, ofA []string
	for i := range 12 {
		for _, c := range []string{"c1", "c2"} {
			e.mustBind(t, "team-a", c, fmt.Sprintf("a%02d", i), nil)
			ofA = append(ofA, fmt.Sprintf("team-a/%s/a%02d", c, i))
		}
		e.mustBind(t, "team-b", "c1", fmt.Sprintf("b%02d", i), nil)
		onC1 = append(onC1, fmt.Sprintf("team-a/c1/a%02d", i), fmt.Sprintf("team-b/c1/b%02d", i))
	}
	e.mustBind(t, "team-b", "c1", "b99", nil) // unbound while the caller pages
	ctx := testkit.Context(t, 30*time.Second)

	ids, sizes := pageBindings(t, e.client, &projectv1.ListNamespaceBindingsRequest{Cluster: "c1", PageSize: 5}, func(page int) {
		if page != 1 {
			return
		}
		e.mustBind(t, "team-b", "c1", "a-behind", nil) // before the caller's position
		e.mustBind(t, "team-b", "c1", "z-ahead", nil)  // after it
		if _, err := e.client.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-b", Cluster: "c1", Namespace: "b99"})); err != nil {
			t.Fatal(err)
		}
	})
	want := append(slices.Clone(onC1), "team-b/c1/z-ahead")
	byClusterNamespace(want)
	// b99 is unbinding (Terminating) until the agent confirms: it may still be listed, as a
	// fresh listing would; everything else must be exactly the bindings there throughout.
	ids = slices.DeleteFunc(ids, func(id string) bool { return id == "team-b/c1/b99" })
	if !slices.Equal(ids, want) {
		t.Fatalf("paged through c1\n%v\nwant each once, in order:\n%v", ids, want)
	}
	for i, n := range sizes[:len(sizes)-1] {
		if n != 5 {
			t.Fatalf("page %d holds %d bindings, want 5 (sizes %v)", i, n, sizes)
		}
	}

	// A project's bindings across clusters page in (cluster, namespace) order too.
	byClusterNamespace(ofA)
	ids, _ = pageBindings(t, e.client, &projectv1.ListNamespaceBindingsRequest{Project: "team-a", PageSize: 7}, nil)
	if !slices.Equal(ids, ofA) {
		t.Fatalf("paged through team-a\n%v\nwant\n%v", ids, ofA)
	}
}

// TestListNamespaceBindingsPagesOnlyWhatTheCallerMayRead: bob may read team-a's bindings and
// not team-0's or team-b's, which sort on both sides of them on the cluster; his pages of the
// cluster, and of every binding, are full pages of team-a's alone.
func TestListNamespaceBindingsPagesOnlyWhatTheCallerMayRead(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.createProject(t, "team-0", "team-a", "team-b")
	var want []string
	for i := range 11 {
		// Namespaces of the three projects interleave in key order on c1.
		e.mustBind(t, "team-0", "c1", fmt.Sprintf("n%02d-0", i), nil)
		e.mustBind(t, "team-a", "c1", fmt.Sprintf("n%02d-a", i), nil)
		e.mustBind(t, "team-b", "c1", fmt.Sprintf("n%02d-b", i), nil)
		want = append(want, fmt.Sprintf("team-a/c1/n%02d-a", i))
	}
	grantRole(t, e.js.JS, "team-a", roles.ProjectViewer)
	bob := projectv1connect.NewProjectServiceClient(testkit.BearerClient(e.http, viewerToken), e.url)
	ctx := testkit.Context(t, 30*time.Second)
	testkit.Eventually(t, 10*time.Second, func() error {
		_, err := bob.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: "team-a"}))
		return err
	})
	for _, req := range []*projectv1.ListNamespaceBindingsRequest{{Cluster: "c1", PageSize: 4}, {PageSize: 4}} {
		ids, sizes := pageBindings(t, bob, req, nil)
		if !slices.Equal(ids, want) {
			t.Fatalf("bob paged through (cluster %q)\n%v\nwant only team-a's:\n%v", req.Cluster, ids, want)
		}
		if !slices.Equal(sizes, []int{4, 4, 3}) {
			t.Fatalf("bob's pages (cluster %q) hold %v bindings, want [4 4 3]", req.Cluster, sizes)
		}
	}
	// Another project's list he is refused outright, token or not.
	if _, err := bob.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: "team-b", PageSize: 4})); code(err) != connect.CodePermissionDenied {
		t.Fatalf("bob listed team-b: %v", err)
	}
}

// TestListNamespaceBindingsRefusesBadPaging: a token that is not one, or one returned for
// other filters, and a page size out of range are InvalidArgument naming the field.
func TestListNamespaceBindingsRefusesBadPaging(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1", "c2")
	e.createProject(t, "team-a")
	for _, ns := range []string{"a", "b", "c"} {
		e.mustBind(t, "team-a", "c1", ns, nil)
	}
	ctx := testkit.Context(t, 30*time.Second)
	first, err := e.client.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Cluster: "c1", PageSize: 1}))
	if err != nil || first.Msg.NextPageToken == "" {
		t.Fatalf("first page: %v %v", first, err)
	}
	tok := first.Msg.NextPageToken
	cases := []struct {
		name  string
		req   *projectv1.ListNamespaceBindingsRequest
		field string
	}{
		{"not a token", &projectv1.ListNamespaceBindingsRequest{Cluster: "c1", PageToken: "%%%"}, "page_token"},
		{"another cluster's", &projectv1.ListNamespaceBindingsRequest{Cluster: "c2", PageToken: tok}, "page_token"},
		{"other filters", &projectv1.ListNamespaceBindingsRequest{Cluster: "c1", Project: "team-a", PageToken: tok}, "page_token"},
		{"negative size", &projectv1.ListNamespaceBindingsRequest{Cluster: "c1", PageSize: -5}, "page_size"},
		{"too large a size", &projectv1.ListNamespaceBindingsRequest{Cluster: "c1", PageSize: 5000}, "page_size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.ListNamespaceBindings(ctx, connect.NewRequest(tc.req))
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	next, err := e.client.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Cluster: "c1", PageSize: 1, PageToken: tok}))
	if err != nil || len(next.Msg.Bindings) != 1 || next.Msg.Bindings[0].Namespace != "b" {
		t.Fatalf("second page: %v %v", next, err)
	}
}
