package rbacsync_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

func memberID(b *rbacv1.ProjectRoleBinding) string {
	return b.Project + "/" + b.Subject.GetName() + ":" + b.RoleTemplate
}

// pageThrough lists with page_size size, calling between(i) after page i, and returns every
// binding of every page in order and each page's length.
func pageThrough(t *testing.T, c rbacv1connect.RBACServiceClient, req *rbacv1.ListProjectRoleBindingsRequest, between func(page int)) ([]string, []int) {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	var ids []string
	var sizes []int
	for page := 0; ; page++ {
		res, err := c.ListProjectRoleBindings(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		for _, b := range res.Msg.Bindings {
			ids = append(ids, memberID(b))
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

// TestListProjectRoleBindingsPages: a caller paging through more bindings than a page sees
// each binding that exists throughout exactly once, in the server's order, while bindings are
// made and removed between its pages; one made behind its position is not seen (it would be on
// a fresh listing) and one made ahead of it is.
func TestListProjectRoleBindingsPages(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	e.createTemplate(t, "reader", nil, rule("", "pods", "get"))
	var always []string
	for i := range 30 {
		e.bindRole(t, "team-a", user(fmt.Sprintf("u%02d", i)), "reader")
		always = append(always, fmt.Sprintf("team-a/u%02d:reader", i))
	}
	for i := range 10 {
		e.bindRole(t, "team-b", user(fmt.Sprintf("v%02d", i)), "reader")
		always = append(always, fmt.Sprintf("team-b/v%02d:reader", i))
	}
	// Removed while the caller pages, from a page it has not reached.
	e.bindRole(t, "team-b", user("v99"), "reader")

	ids, sizes := pageThrough(t, e.rbac, &rbacv1.ListProjectRoleBindingsRequest{PageSize: 7}, func(page int) {
		if page != 1 {
			return
		}
		e.bindRole(t, "team-a", user("a-behind"), "reader") // before the caller's position
		e.bindRole(t, "team-b", user("z-ahead"), "reader")  // after it
		e.unbindRole(t, "team-b", user("v99"), "reader")
	})
	want := append(slices.Clone(always), "team-b/z-ahead:reader")
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("paged through\n%v\nwant each once, in order:\n%v", ids, want)
	}
	for i, n := range sizes[:len(sizes)-1] {
		if n != 7 {
			t.Fatalf("page %d holds %d bindings, want 7 (sizes %v)", i, n, sizes)
		}
	}
	// A fresh listing does see the one made behind.
	fresh, _ := pageThrough(t, e.rbac, &rbacv1.ListProjectRoleBindingsRequest{PageSize: 1000}, nil)
	if !slices.Contains(fresh, "team-a/a-behind:reader") || len(fresh) != len(want)+1 {
		t.Fatalf("fresh listing %v", fresh)
	}
}

// TestListProjectRoleBindingsPagesOnlyWhatTheCallerMayRead: alice may read team-a's members
// and not team-b's; paging all projects she gets only team-a's, in full pages (the filter is
// before the page, so a page is not short for bindings she may not see and no token leads
// into team-b).
func TestListProjectRoleBindingsPagesOnlyWhatTheCallerMayRead(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	e.createTemplate(t, "reader", nil, rule("", "pods", "get"))
	e.bindRole(t, "team-a", user("alice"), roles.ProjectViewer)
	want := []string{"team-a/alice:" + roles.ProjectViewer}
	// The authorizer learns alice's binding from its own view, a moment after the bind.
	ctx := testkit.Context(t, 30*time.Second)
	testkit.Eventually(t, 10*time.Second, func() error {
		res, err := e.as["alice"].ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-a"}))
		if err != nil || len(res.Msg.Bindings) == 0 {
			return fmt.Errorf("alice cannot read team-a's members yet: %v", err)
		}
		return nil
	})
	for i := range 12 {
		// Projects sort first, so team-0's bindings, which alice may not read, come before
		// hers and team-b's after.
		e.bindRole(t, "team-0", user(fmt.Sprintf("w%02d", i)), "reader")
		e.bindRole(t, "team-a", user(fmt.Sprintf("u%02d", i)), "reader")
		e.bindRole(t, "team-b", user(fmt.Sprintf("v%02d", i)), "reader")
		want = append(want, fmt.Sprintf("team-a/u%02d:reader", i))
	}
	slices.Sort(want)
	ids, sizes := pageThrough(t, e.as["alice"], &rbacv1.ListProjectRoleBindingsRequest{PageSize: 5}, nil)
	if !slices.Equal(ids, want) {
		t.Fatalf("alice paged through\n%v\nwant only team-a's:\n%v", ids, want)
	}
	if !slices.Equal(sizes, []int{5, 5, 3}) {
		t.Fatalf("alice's pages hold %v bindings, want [5 5 3]", sizes)
	}
	// bob may read no project's members: one empty page, no token.
	ids, sizes = pageThrough(t, e.as["bob"], &rbacv1.ListProjectRoleBindingsRequest{PageSize: 5}, nil)
	if len(ids) != 0 || len(sizes) != 1 {
		t.Fatalf("bob paged through %v in pages %v", ids, sizes)
	}
}

// TestListProjectRoleBindingsRefusesBadPaging: a token that is not one, or one returned for
// other filters, and a page size out of range are InvalidArgument naming the field.
func TestListProjectRoleBindingsRefusesBadPaging(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	e.createTemplate(t, "reader", nil, rule("", "pods", "get"))
	for i := range 3 {
		e.bindRole(t, "team-a", user(fmt.Sprintf("u%d", i)), "reader")
	}
	first, err := e.rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-a", PageSize: 1}))
	if err != nil || first.Msg.NextPageToken == "" {
		t.Fatalf("first page: %v %v", first, err)
	}
	tok := first.Msg.NextPageToken
	cases := []struct {
		name  string
		req   *rbacv1.ListProjectRoleBindingsRequest
		field string
	}{
		{"not a token", &rbacv1.ListProjectRoleBindingsRequest{Project: "team-a", PageToken: "not a token!"}, "page_token"},
		{"a forged token", &rbacv1.ListProjectRoleBindingsRequest{Project: "team-a", PageToken: "cDEueHgudGVhbS1h"}, "page_token"},
		{"another project's", &rbacv1.ListProjectRoleBindingsRequest{Project: "team-b", PageToken: tok}, "page_token"},
		{"other filters", &rbacv1.ListProjectRoleBindingsRequest{Project: "team-a", RoleTemplate: "reader", PageToken: tok}, "page_token"},
		{"negative size", &rbacv1.ListProjectRoleBindingsRequest{Project: "team-a", PageSize: -1}, "page_size"},
		{"too large a size", &rbacv1.ListProjectRoleBindingsRequest{Project: "team-a", PageSize: 1001}, "page_size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.rbac.ListProjectRoleBindings(ctx, connect.NewRequest(tc.req))
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	// The same filters go on from it.
	next, err := e.rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-a", PageSize: 1, PageToken: tok}))
	if err != nil || len(next.Msg.Bindings) != 1 || next.Msg.Bindings[0].Subject.Name != "u1" {
		t.Fatalf("second page: %v %v", next, err)
	}
}
