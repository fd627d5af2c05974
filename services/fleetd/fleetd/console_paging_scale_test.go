package fleetd_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleetstream/fleetstream/pkg/server/oidctest"
)

// TestConsoleFleetAndMembersAtScale measures issue 32's scale figures in the browser (its setup
// takes a while on a 2-core machine, so it runs only with FLEETSTREAM_CONSOLE_SCALE set): the
// Fleet page with 1,000 more clusters (the first server page of 200 on screen, and the next
// after "More clusters") and the Projects page of a project with 5,000 members (the first
// server page of 100 on screen, the rest behind "More members"). With
// FLEETSTREAM_REQUIRE_BROWSER set each must be on screen within a second.
func TestConsoleFleetAndMembersAtScale(t *testing.T) {
	if os.Getenv("FLEETSTREAM_CONSOLE_SCALE") == "" {
		t.Skip("set FLEETSTREAM_CONSOLE_SCALE=1 to measure the Fleet page at 1,000 clusters and a project's members at 5,000")
	}
	exe := chromium(t)
	api := consoleFleet(t, oidctest.New(t))
	const clusters, members = 1000, 5000
	start := time.Now()
	calls := func(n int, body func(i int) (string, string)) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				proc, req := body(i)
				if code, res := api.callFull(t, "admin", proc, req); code != "" {
					t.Errorf("%s %s: %s %s", proc, req, code, res)
				}
			}()
		}
		wg.Wait()
	}
	calls(clusters, func(i int) (string, string) {
		return "/fleetstream.cluster.v1.ClusterService/RegisterCluster", fmt.Sprintf(`{"name":"scale-%04d","labels":{"env":"scale"}}`, i)
	})
	// A project with no namespace: its members are what is measured, not rbac-sync writing
	// RoleBindings of 5,000 subjects.
	if code, res := api.callFull(t, "admin", "/fleetstream.project.v1.ProjectService/CreateProject", `{"name":"team-big"}`); code != "" {
		t.Fatalf("create team-big: %s %s", code, res)
	}
	calls(members, func(i int) (string, string) {
		return "/fleetstream.rbac.v1.RBACService/BindProjectRole",
			fmt.Sprintf(`{"project":"team-big","subject":{"kind":"SUBJECT_KIND_USER","name":"u%04d"},"roleTemplate":"project-viewer"}`, i)
	})
	t.Logf("setup: %d clusters and %d project role bindings in %v", clusters, members, time.Since(start).Round(time.Millisecond))

	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]), chromedp.ExecPath(exe), chromedp.WindowSize(1280, 800), chromedp.NoSandbox)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	b := &browser{ctx: bctx}
	if err := chromedp.Do(bctx); err != nil {
		t.Fatal(err)
	}
	b.run(t, "open", chromedp.Navigate(api.base+"/ui/"))
	b.signIn(t, "token-admin")
	b.waitPage(t, "fleet")
	limit := func(what string, took time.Duration) {
		t.Helper()
		t.Logf("%s: %v", what, took.Round(time.Millisecond))
		if timed() && took > time.Second {
			t.Errorf("%s took %v, over 1 s", what, took)
		}
	}
	for range 3 {
		s := time.Now()
		b.run(t, "projects", b.load(api.base, "#/projects?project=team-big"))
		b.waitPage(t, "projects")
		b.run(t, "first page of members", chromedp.WaitVisible(chromedp.ID("members-more")))
		limit("Projects page, first 100 of 5,000 members on screen", time.Since(s))
		if got := len(b.texts(t, "#members tbody tr")); got != 100 {
			t.Fatalf("first page of members: %d rows, want 100", got)
		}
		s = time.Now()
		b.run(t, "fleet", b.load(api.base, "#/fleet"))
		b.waitPage(t, "fleet")
		b.run(t, "first page of clusters", chromedp.WaitVisible(chromedp.ID("fleet-more")))
		limit(fmt.Sprintf("Fleet page, first 200 of %d clusters on screen", clusters+2), time.Since(s))
		if got := len(b.texts(t, "#clusters tbody tr")); got != 200 {
			t.Fatalf("Fleet page: %d rows, want 200", got)
		}
		s = time.Now()
		b.run(t, "more clusters", chromedp.Click(chromedp.ID("fleet-more")), chromedp.WaitVisible(chromedp.CSS(`tr[data-cluster="scale-0397"]`)))
		limit("Fleet page, the next 200 after More clusters", time.Since(s))
	}
	b.noErrors(t, "fleet and members at scale")
}
