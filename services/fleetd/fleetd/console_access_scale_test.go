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

// TestConsoleAccessAtScale measures the Access page of a project with 200 namespaces and 300
// members (its setup takes ~30 s on a 2-core machine, so it runs only with
// FLEETSTREAM_CONSOLE_SCALE set): the first page of the matrix (50 subjects × 20 namespaces) now
// and at a moment, and the next page of subjects. With FLEETSTREAM_REQUIRE_BROWSER set (make
// test-browser) each must be on screen within a second.
func TestConsoleAccessAtScale(t *testing.T) {
	if os.Getenv("FLEETSTREAM_CONSOLE_SCALE") == "" {
		t.Skip("set FLEETSTREAM_CONSOLE_SCALE=1 to measure the Access page at 200 namespaces and 300 members")
	}
	exe := chromium(t)
	api := consoleFleet(t, oidctest.New(t))
	const namespaces, members = 200, 300
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
	calls(namespaces, func(i int) (string, string) {
		return "/fleetstream.project.v1.ProjectService/BindNamespace",
			fmt.Sprintf(`{"project":"team-a","cluster":%q,"namespace":"ns-%03d"}`, []string{"prod-eu", "dev-us"}[i%2], i)
	})
	calls(members, func(i int) (string, string) {
		return "/fleetstream.rbac.v1.RBACService/BindProjectRole",
			fmt.Sprintf(`{"project":"team-a","subject":{"kind":"SUBJECT_KIND_USER","name":"u%03d"},"roleTemplate":"project-viewer"}`, i)
	})
	t.Logf("setup: %d namespaces and %d project role bindings in %v", namespaces, members, time.Since(start).Round(time.Millisecond))

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
	check := func(what string, took time.Duration, rows, cols int) {
		t.Helper()
		gotRows, gotCols := len(b.texts(t, "#access-matrix tbody tr")), len(b.texts(t, "#access-matrix thead th"))-1
		t.Logf("%s: %v, %d rows × %d columns", what, took.Round(time.Millisecond), gotRows, gotCols)
		if gotRows != rows || gotCols != cols {
			t.Errorf("%s: %d rows × %d columns, want %d × %d", what, gotRows, gotCols, rows, cols)
		}
		if timed() && took > time.Second {
			t.Errorf("%s took %v, over 1 s", what, took)
		}
	}
	for range 2 {
		s := time.Now()
		b.run(t, "access", b.load(api.base, "#/access?project=team-a"))
		b.waitPage(t, "access")
		check("first page now", time.Since(s), 50, 20)
	}
	s := time.Now()
	b.run(t, "next subjects", chromedp.Click(chromedp.ID("access-rows-next")), chromedp.WaitVisible(chromedp.CSS(`#access-view[data-shown="now"]`)))
	check("next page of subjects", time.Since(s), 50, 20)
	if got := b.texts(t, "#access-page"); !slices.Equal(got, []string{"Subjects 51-100 of 302, namespaces 1-20 of 202"}) {
		t.Errorf("pager %q", got)
	}
	at := time.Now().UTC().Format(time.RFC3339Nano)
	// The first AccessAt after the setup folds the ~800 events it appended (rbac-sync's
	// snapshots are taken periodically, docs/rbac.md): the server's cost, logged, not limited.
	s = time.Now()
	b.run(t, "access at, cold", b.load(api.base, "#/access?project=team-a&at="+at))
	b.waitPage(t, "access")
	t.Logf("first page at a moment, the server's first AccessAt of the new history: %v", time.Since(s).Round(time.Millisecond))
	for range 2 {
		s := time.Now()
		b.run(t, "access at", b.load(api.base, "#/access?project=team-a&at="+at))
		b.waitPage(t, "access")
		check("first page at a moment (20 × AccessAt)", time.Since(s), 20, 20)
	}
	b.noErrors(t, "access at scale")
}
