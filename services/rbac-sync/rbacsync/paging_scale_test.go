package rbacsync_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/paging"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// TestFirstPageOfManyProjectRoleBindings measures issue 32's scale goal for the members list:
// with FLEETSTREAM_PAGING_BINDINGS project role bindings (50000 for the figure; the
// test is skipped without it, as making them takes minutes) over 100 projects, the first page
// of ListProjectRoleBindings, as the console asks for it (Connect JSON, page_size 1000) and as
// fleetctl does (the default page, protobuf), answers in well under a second, for an admin (all
// projects) and for a viewer of one project (whose filter runs over every binding first).
func TestFirstPageOfManyProjectRoleBindings(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("FLEETSTREAM_PAGING_BINDINGS"))
	if n <= 0 {
		t.Skip("set FLEETSTREAM_PAGING_BINDINGS (e.g. 50000) to measure the first page at that many project role bindings")
	}
	e := start(t, nil, rbacsync.Config{}, withoutNamespaceBinding)
	ctx := testkit.Context(t, 30*time.Minute)
	e.createTemplate(t, "reader", nil, rule("", "pods", "get"))
	const projects = 100
	began := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			_, err := e.rbac.BindProjectRole(gctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{
				Project: fmt.Sprintf("p%03d", i%projects), Subject: user(fmt.Sprintf("u%06d", i)), RoleTemplate: "reader"}))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	e.bindRole(t, "p050", user("alice"), roles.ProjectViewer)
	t.Logf("%d project role bindings made in %v", n, time.Since(began).Round(time.Millisecond))
	testkit.Eventually(t, 30*time.Second, func() error {
		res, err := e.as["alice"].ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{PageSize: 1}))
		if err != nil || len(res.Msg.Bindings) == 0 {
			return fmt.Errorf("alice cannot read p050's members yet: %v", err)
		}
		return nil
	})

	measure := func(name string, want int, call func() (int, error)) {
		t.Helper()
		var took []time.Duration
		for range 20 {
			start := time.Now()
			got, err := call()
			took = append(took, time.Since(start))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got != want {
				t.Fatalf("%s: first page of %d, want %d", name, got, want)
			}
		}
		slices.Sort(took)
		p50, worst := took[len(took)/2], took[len(took)-1]
		t.Logf("%s: first page of %d in %v (p50), %v (slowest of 20)", name, want, p50.Round(100*time.Microsecond), worst.Round(100*time.Microsecond))
		if worst > time.Second {
			t.Errorf("%s: the first page took %v, over a second", name, worst)
		}
	}
	protoPage := func(as string, req *rbacv1.ListProjectRoleBindingsRequest) func() (int, error) {
		return func() (int, error) {
			res, err := e.as[as].ListProjectRoleBindings(ctx, connect.NewRequest(req))
			if err != nil {
				return 0, err
			}
			return len(res.Msg.Bindings), nil
		}
	}
	jsonPage := func(as, body string) func() (int, error) {
		return func() (int, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/fleetstream.rbac.v1.RBACService/ListProjectRoleBindings", bytes.NewBufferString(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+tokenOf(as))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			defer res.Body.Close()
			data, err := io.ReadAll(res.Body)
			if err != nil || res.StatusCode != http.StatusOK {
				return 0, fmt.Errorf("HTTP %d %s %v", res.StatusCode, data, err)
			}
			return bytes.Count(data, []byte(`"roleTemplate"`)), nil
		}
	}
	perProject := n / projects
	measure("admin, every project, default page (protobuf)", paging.DefaultSize, protoPage("admin", &rbacv1.ListProjectRoleBindingsRequest{}))
	measure("admin, every project, 1000 (Connect JSON)", paging.MaxSize, jsonPage("admin", `{"pageSize":1000}`))
	measure("admin, one project, 1000 (Connect JSON)", min(perProject, paging.MaxSize), jsonPage("admin", `{"project":"p007","pageSize":1000}`))
	measure("viewer of one project, every project, 1000 (Connect JSON)", min(perProject+1, paging.MaxSize), jsonPage("alice", `{"pageSize":1000}`))
	// Every page, as fleetctl member list and export read them: measured, not bounded.
	start := time.Now()
	total, pages := 0, 0
	req := &rbacv1.ListProjectRoleBindingsRequest{PageSize: paging.MaxSize}
	if err := paging.All(func(token string) (string, error) {
		req.PageToken = token
		res, err := e.rbac.ListProjectRoleBindings(ctx, connect.NewRequest(req))
		if err != nil {
			return "", err
		}
		total, pages = total+len(res.Msg.Bindings), pages+1
		return res.Msg.NextPageToken, nil
	}); err != nil {
		t.Fatal(err)
	}
	if total != n+1 {
		t.Fatalf("every page holds %d bindings, want %d", total, n+1)
	}
	t.Logf("admin, every page of 1000 (protobuf): %d bindings in %d pages in %v", total, pages, time.Since(start).Round(time.Millisecond))
}
