package fleetd_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// consoleMembersPaged: a project with more members than the Projects page shows at once
// (MEMBERS_PAGE, 100) shows the first server page, says there are more, and "More members"
// brings the rest page by page, each member once and in the server's order; at the last page
// the button goes and the count says how many.
func consoleMembersPaged(t *testing.T, b *browser, api *rawClient) {
	const n = 130
	if code, body := api.callFull(t, "admin", "/fleetstream.project.v1.ProjectService/CreateProject", `{"name":"team-many"}`); code != "" {
		t.Fatalf("create team-many: %s %s", code, body)
	}
	var want []string
	for i := range n {
		name := fmt.Sprintf("u%03d", i)
		if code, body := api.callFull(t, "admin", "/fleetstream.rbac.v1.RBACService/BindProjectRole",
			fmt.Sprintf(`{"project":"team-many","subject":{"kind":"SUBJECT_KIND_USER","name":%q},"roleTemplate":"project-viewer"}`, name)); code != "" {
			t.Fatalf("bind %s: %s %s", name, code, body)
		}
		want = append(want, "user:"+name+"|project-viewer")
	}
	rows := func() []string {
		return eval[[]string](t, b, `[...document.querySelectorAll("#members tbody tr")].map(r => r.dataset.member)`)
	}
	began := time.Now()
	b.run(t, "team-many", b.load(api.base, "#/projects?project=team-many"))
	b.waitPage(t, "projects")
	b.run(t, "first page", chromedp.WaitVisible(chromedp.ID("members-more")))
	t.Logf("Projects page with the first %d of team-many's %d members on screen in %v", 100, n, time.Since(began).Round(time.Millisecond))
	if got := rows(); !slices.Equal(got, want[:100]) {
		t.Fatalf("first page of members %v, want the first 100 in order", got)
	}
	if got := b.texts(t, "#members-count"); len(got) != 1 || !strings.Contains(got[0], "100 members shown; more on the server") {
		t.Fatalf("count %q", got)
	}
	b.run(t, "more", chromedp.Click(chromedp.ID("members-more")),
		chromedp.WaitNotVisible(chromedp.ID("members-more")))
	if got := rows(); !slices.Equal(got, want) {
		t.Fatalf("after More members %v, want all %d once, in order", got, n)
	}
	if got := b.texts(t, "#members-count"); len(got) != 1 || got[0] != fmt.Sprintf("%d members.", n) {
		t.Fatalf("count after the last page %q", got)
	}
	b.noErrors(t, "members paged")
}

// consoleFleetPaged: with more clusters than the Fleet page shows at once (FLEET_PAGE, 200)
// the page shows the first server page and says there are more; "More clusters" brings the
// rest after them in name order, each once, and a selector pages only what it matches.
func consoleFleetPaged(t *testing.T, b *browser, api *rawClient) {
	const n = 210
	for i := range n {
		if code, body := api.callFull(t, "admin", "/fleetstream.cluster.v1.ClusterService/RegisterCluster",
			fmt.Sprintf(`{"name":"zz-%03d","labels":{"env":"paged"}}`, i)); code != "" {
			t.Fatalf("register zz-%03d: %s %s", i, code, body)
		}
	}
	defer func() {
		for i := range n {
			if code, body := api.callFull(t, "admin", "/fleetstream.cluster.v1.ClusterService/DeregisterCluster", fmt.Sprintf(`{"name":"zz-%03d"}`, i)); code != "" {
				t.Errorf("deregister zz-%03d: %s %s", i, code, body)
			}
		}
	}()
	names := func() []string {
		return eval[[]string](t, b, `[...document.querySelectorAll("#clusters tbody tr")].map(r => r.dataset.cluster)`)
	}
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("zz-%03d", i))
	}
	b.run(t, "fleet paged", b.load(api.base, "#/fleet?selector=env%3Dpaged"))
	b.waitPage(t, "fleet")
	b.run(t, "first page", chromedp.WaitVisible(chromedp.ID("fleet-more")))
	if got := names(); !slices.Equal(got, want[:200]) {
		t.Fatalf("first page of clusters %v, want the first 200 in order", got)
	}
	if got := b.texts(t, "#fleet-count"); len(got) != 1 || got[0] != "200 clusters shown; more on the server matching env=paged" {
		t.Fatalf("count %q", got)
	}
	b.run(t, "more", chromedp.Click(chromedp.ID("fleet-more")), chromedp.WaitNotVisible(chromedp.ID("fleet-more")))
	if got := names(); !slices.Equal(got, want) {
		t.Fatalf("after More clusters %v, want all %d once, in order", got, n)
	}
	if got := b.texts(t, "#fleet-count"); len(got) != 1 || got[0] != fmt.Sprintf("%d clusters matching env=paged", n) {
		t.Fatalf("count after the last page %q", got)
	}
	b.noErrors(t, "fleet paged")
}
