package fleetd_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// whoCanSubjects asks fleetd's WhoCan, as the admin, which subjects hold which templates in
// cluster/namespace: "user:viewer|project-viewer", …
func whoCanSubjects(t *testing.T, api *rawClient, cluster, namespace string) []string {
	t.Helper()
	code, body := api.callFull(t, "admin", "/fleetstream.rbac.v1.RBACService/WhoCan", fmt.Sprintf(`{"cluster":%q,"namespace":%q}`, cluster, namespace))
	if code != "" {
		t.Fatalf("WhoCan %s/%s: %s %s", cluster, namespace, code, body)
	}
	var res struct {
		Grants []struct {
			Subject      struct{ Kind, Name string }
			RoleTemplate string
		}
	}
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range res.Grants {
		out = append(out, strings.ToLower(strings.TrimPrefix(g.Subject.Kind, "SUBJECT_KIND_"))+":"+g.Subject.Name+"|"+g.RoleTemplate)
	}
	return out
}

// accessCells returns the matrix row of subject (its subject ID) as place → cell text, nil when
// the matrix has no such row.
func accessCells(t *testing.T, b *browser, subject string) map[string]string {
	t.Helper()
	subj, _ := json.Marshal(subject)
	return eval[map[string]string](t, b, fmt.Sprintf(`(() => {
		const r = [...document.querySelectorAll("#access-matrix tbody tr")].find(r => r.dataset.subject === %s);
		return r ? Object.fromEntries([...r.querySelectorAll("td")].map(td => [td.dataset.place, td.textContent])) : null;
	})()`, subj))
}

// consoleAccessPage: the matrix from the project's role bindings, the page's WhoCan for one
// namespace and a verb, the matrix's pages, a grant previewed by the dry run and made
// from the keyboard (seen on the page and by fleetd's WhoCan), a revoke, and AccessAt's view of
// a moment when the revoked role was held; markup in a subject's name and a template's display
// name is text throughout.
func consoleAccessPage(t *testing.T, b *browser, api *rawClient) {
	base := api.base
	// A template whose display name is markup, to grant to the user whose name is markup.
	if code, body := api.callFull(t, "admin", "/fleetstream.rbac.v1.RBACService/CreateRoleTemplate",
		fmt.Sprintf(`{"template":{"name":"markup-role","displayName":%q,"rules":[{"verbs":["get","list"],"apiGroups":[""],"resources":["configmaps"]}]}}`, xss)); code != "" {
		t.Fatalf("create markup-role: %s %s", code, body)
	}
	xssSubject := "user:" + xss
	before := time.Now()

	start := time.Now()
	b.run(t, "access", b.load(base, "#/access?project=team-a"))
	b.waitPage(t, "access")
	t.Logf("access page, navigation to the matrix on screen: %v", time.Since(start).Round(time.Millisecond))
	if got := b.texts(t, "#access-matrix thead th"); !slices.Equal(got, []string{"Subject", "dev-us/web", "prod-eu/web"}) {
		t.Errorf("matrix columns %q, want team-a's two namespaces", got)
	}
	for _, s := range []string{"user:viewer", "group:oidc:team-a-viewers"} {
		cells := accessCells(t, b, s)
		if cells["prod-eu/web"] != "project-viewer" || cells["dev-us/web"] != "project-viewer" {
			t.Errorf("%s's row %v, want project-viewer in both namespaces", s, cells)
		}
	}
	if got := b.texts(t, `#access-matrix tbody th`); len(got) != 2 {
		t.Errorf("matrix rows %q, want the viewer and the viewers' group", got)
	}
	g := b.texts(t, `tr[data-grant="user:viewer|project-viewer"] > *`)
	if len(g) != 6 || g[0] != "User viewer" || !strings.Contains(g[2], "get, list, watch on pods") ||
		!strings.Contains(g[3], "RoleBinding fleetstream:project-viewer → ClusterRole fleetstream:project-viewer") ||
		!strings.Contains(g[3], "project role binding team-a/user:viewer:project-viewer") || !strings.Contains(g[3], "by admin") ||
		!strings.Contains(g[4], "dev-us/web") || !strings.Contains(g[4], "prod-eu/web") {
		t.Errorf("the viewer's grant row %q: want its rules, RoleBinding, ClusterRole, binding and places", g)
	}
	b.screenshot(t, "access")
	b.noErrors(t, "access page")

	// A grant from the keyboard: type the subject, pick the template, Enter asks the dry run.
	b.run(t, "fill the grant form", chromedp.Focus(chromedp.ID("grant-name")), chromedp.SendKeys(chromedp.ID("grant-name"), xss),
		chromedp.SetValue(chromedp.ID("grant-template"), "markup-role"),
		chromedp.Focus(chromedp.ID("grant-name")), chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.ID("confirm")))
	if got := b.texts(t, "#plan-summary"); len(got) != 1 || got[0] != "2 RoleBindings would change: 2 created." {
		t.Errorf("preview summary %q, want 2 created", got)
	}
	plan := eval[[][]string](t, b, `[...document.querySelectorAll("#plan tbody tr")].map(r => [...r.cells].map(c => c.textContent))`)
	if len(plan) != 2 || !slices.Equal(plan[0], []string{"dev-us", "web", "fleetstream:markup-role", "created", "none", "User " + xss}) ||
		plan[1][0] != "prod-eu" {
		t.Errorf("preview plan %q, want fleetstream:markup-role created for User %s on dev-us/web and prod-eu/web", plan, xss)
	}
	if q := b.texts(t, "#confirm-text li"); !slices.Equal(q, []string{"get, list on configmaps (core)"}) {
		t.Errorf("preview's rules gained %q", q)
	}
	if got := eval[string](t, b, `document.activeElement.id`); got != "confirm-no" {
		t.Errorf("focus in the preview on %q, want the cancel button", got)
	}
	b.screenshot(t, "access-grant-preview")
	// Escape: nothing granted.
	b.run(t, "escape", chromedp.KeyEvent(kb.Escape), chromedp.WaitNotVisible(chromedp.ID("confirm")))
	time.Sleep(300 * time.Millisecond)
	if slices.Contains(whoCanSubjects(t, api, "prod-eu", "web"), xssSubject+"|markup-role") {
		t.Fatal("the cancelled preview granted the role")
	}
	if note := b.texts(t, "#grant-note"); len(note) != 1 || note[0] != "" {
		t.Errorf("after cancelling, the grant note says %q", note)
	}
	// Again, and confirm from the keyboard: Shift+Tab from Cancel to Grant, Enter.
	b.run(t, "preview again", chromedp.Click(chromedp.ID("grant-preview")), chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.KeyEvent(kb.Tab, chromedp.KeyModifiers(kb.ModifierShift)))
	if got := eval[string](t, b, `document.activeElement.id`); got != "confirm-yes" {
		t.Fatalf("Shift+Tab from Cancel lands on %q, want the grant button", got)
	}
	b.run(t, "grant", chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.ID("grant-done")))
	testkit.Eventually(t, 10*time.Second, func() error {
		if cells := accessCells(t, b, xssSubject); cells["prod-eu/web"] != "markup-role" || cells["dev-us/web"] != "markup-role" {
			return fmt.Errorf("the granted subject's row %v", cells)
		}
		return nil
	})
	if got := eval[[]string](t, b, `[...document.querySelectorAll("#access-matrix tbody th")].map(e => e.textContent)`); !slices.Contains(got, "User "+xss) {
		t.Errorf("matrix subjects %q, want the markup user's name as text", got)
	}
	if got := eval[string](t, b, `[...document.querySelectorAll("#access-grants tbody tr")].find(r => r.dataset.grant.endsWith("|markup-role")).cells[1].textContent`); got != "markup-role"+xss {
		t.Errorf("markup-role's template cell %q, want its name and display name as text", got)
	}
	if imgs := eval[int](t, b, `document.querySelectorAll("img").length`); imgs != 0 {
		t.Errorf("%d img elements on the access page: markup was parsed", imgs)
	}
	// The page's WhoCan, for one namespace and for a verb the role allows (and one it does not).
	b.run(t, "whocan", chromedp.SetValue(chromedp.ID("whocan-place"), "prod-eu/web"), chromedp.SetValue(chromedp.ID("whocan-verb"), "list"),
		chromedp.SetValue(chromedp.ID("whocan-resource"), "configmaps"), chromedp.Click(chromedp.ID("whocan-ask")), chromedp.WaitVisible(chromedp.ID("whocan-status")))
	who := eval[[]string](t, b, `[...document.querySelectorAll("#whocan tbody tr")].map(r => r.dataset.grant + " " + r.cells[2].firstChild.textContent)`)
	if !slices.Contains(who, xssSubject+"|markup-role RoleBinding fleetstream:markup-role → ClusterRole fleetstream:markup-role") || len(who) != 3 {
		t.Errorf("WhoCan on the page for list configmaps in prod-eu/web: %q, want the markup user's grant and the two viewers'", who)
	}
	b.run(t, "whocan delete", chromedp.SetValue(chromedp.ID("whocan-verb"), "delete"), chromedp.Click(chromedp.ID("whocan-ask")),
		chromedp.WaitVisible(chromedp.CSS(`#whocan-status`)))
	testkit.Eventually(t, 5*time.Second, func() error {
		if got := b.texts(t, "#whocan-status"); len(got) != 1 || !strings.Contains(got[0], ": 0 grants allowing delete configmaps") {
			return fmt.Errorf("WhoCan for delete configmaps says %q, want no grant", got)
		}
		return nil
	})
	// fleetd's own answer, not the page's: the grant is there.
	for _, c := range []string{"prod-eu", "dev-us"} {
		if got := whoCanSubjects(t, api, c, "web"); !slices.Contains(got, xssSubject+"|markup-role") {
			t.Errorf("WhoCan %s/web %q lacks the console's grant", c, got)
		}
	}
	b.noErrors(t, "grant")

	// Revoke it from the page; the moment between is when the role was held.
	held := time.Now()
	time.Sleep(50 * time.Millisecond)
	b.run(t, "revoke", chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll("[data-revoke]")].find(e => e.dataset.revoke.endsWith("|markup-role")).click()`),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	if got := b.texts(t, "#plan-summary"); len(got) != 1 || got[0] != "2 RoleBindings would change: 2 deleted." {
		t.Errorf("revoke preview %q, want 2 deleted", got)
	}
	b.run(t, "confirm revoke", chromedp.Click(chromedp.ID("confirm-yes")), chromedp.WaitVisible(chromedp.ID("revoke-done")))
	testkit.Eventually(t, 10*time.Second, func() error {
		if cells := accessCells(t, b, xssSubject); cells != nil {
			return fmt.Errorf("the revoked subject's row %v is still shown", cells)
		}
		return nil
	})
	if slices.Contains(whoCanSubjects(t, api, "prod-eu", "web"), xssSubject+"|markup-role") {
		t.Error("WhoCan still lists the revoked grant")
	}

	// Who could, at the moment it was held: the time control, from the keyboard (Enter in the
	// subjects field). The revoked user is named: the members now do not include it.
	b.run(t, "at the moment held", chromedp.SetValue(chromedp.ID("at"), ""),
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(d => document.getElementById("at").value = new Date(d - d.getTimezoneOffset() * 60000).toISOString().slice(0, 23))(new Date(%d))`, held.UnixMilli())),
		chromedp.SetValue(chromedp.ID("at-subjects"), xssSubject), chromedp.Focus(chromedp.ID("at-subjects")))
	askedAt := time.Now()
	b.run(t, "enter", chromedp.KeyEvent(kb.Enter))
	heldISO := held.UTC().Truncate(time.Millisecond).Format("2006-01-02T15:04:05.000Z")
	b.run(t, "wait for the view", chromedp.WaitVisible(chromedp.CSS(`#access-view[data-shown="`+heldISO+`"]`)))
	t.Logf("access at a moment (AccessAt for 3 subjects), Enter to the view on screen: %v", time.Since(askedAt).Round(time.Millisecond))
	if cells := accessCells(t, b, xssSubject); cells["prod-eu/web"] != "markup-role (no longer)" || cells["dev-us/web"] != "markup-role (no longer)" {
		t.Errorf("at %s the revoked subject's row %v, want markup-role (no longer) in both namespaces", heldISO, cells)
	}
	if cells := accessCells(t, b, "user:viewer"); cells["prod-eu/web"] != "project-viewer" {
		t.Errorf("at %s the viewer's row %v, want project-viewer (still held)", heldISO, cells)
	}
	if loc := eval[string](t, b, `location.hash`); !strings.Contains(loc, "at=") || !strings.Contains(loc, "subject=") {
		t.Errorf("the location %q does not keep the moment and subject", loc)
	}
	if got := eval[string](t, b, `document.activeElement.id`); got != "at-subjects" {
		t.Errorf("after Enter the focus is on %q, want it left in the form", got)
	}
	b.screenshot(t, "access-at")
	// Before the grant (a link to that moment): the user held nothing.
	b.run(t, "before the grant", b.load(base, "#/access?project=team-a&subject="+url.QueryEscape(xssSubject)+"&at="+before.UTC().Format("2006-01-02T15:04:05.000Z07:00")))
	b.waitPage(t, "access")
	if cells := accessCells(t, b, xssSubject); cells["prod-eu/web"] != "–" || cells["dev-us/web"] != "–" {
		t.Errorf("before the grant the subject's row %v, want nothing held", cells)
	}
	// The slider from the keyboard: End is now (the revoked user is gone, the time field
	// empty), Home is the project's creation (no one held anything yet).
	b.run(t, "slider to now", chromedp.Focus(chromedp.ID("at-slider")), chromedp.KeyEvent(kb.End),
		chromedp.WaitVisible(chromedp.CSS(`#access-view[data-shown="now"]`)))
	if cells := accessCells(t, b, xssSubject); cells != nil {
		t.Errorf("now, the revoked subject's row %v", cells)
	}
	if v := eval[string](t, b, `document.getElementById("at").value`); v != "" {
		t.Errorf("at the slider's end the time field says %q, want empty (now)", v)
	}
	b.run(t, "slider to the start", chromedp.KeyEvent(kb.Home),
		chromedp.WaitVisible(chromedp.CSS(`#access-view:not([data-shown="now"]):not([data-shown=""])`)))
	if cells := accessCells(t, b, "user:viewer"); cells["prod-eu/web"] != "–" {
		t.Errorf("at team-a's creation the viewer's row %v, want nothing held", cells)
	}
	// The matrix pages: a link to the second namespace shows it alone, and "Previous
	// namespaces" (by keyboard) goes back to the first page, keeping the focus on the pager.
	b.run(t, "second column", b.load(base, "#/access?project=team-a&col=1"))
	b.waitPage(t, "access")
	if got := b.texts(t, "#access-matrix thead th"); !slices.Equal(got, []string{"Subject", "prod-eu/web"}) {
		t.Errorf("matrix columns from col=1 %q", got)
	}
	if got := b.texts(t, "#access-page"); !slices.Equal(got, []string{"Subjects 1-2 of 2, namespaces 2-2 of 2"}) {
		t.Errorf("pager says %q", got)
	}
	b.run(t, "previous namespaces", chromedp.Focus(chromedp.ID("access-cols-prev")), chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(chromedp.CSS(`#access-view[data-shown="now"]`)))
	testkit.Eventually(t, 5*time.Second, func() error {
		if got := b.texts(t, "#access-matrix thead th"); !slices.Equal(got, []string{"Subject", "dev-us/web", "prod-eu/web"}) {
			return fmt.Errorf("matrix columns after Previous %q", got)
		}
		return nil
	})
	if got := eval[string](t, b, `document.activeElement.id + " " + location.hash`); got != "access-cols-prev #/access?project=team-a" {
		t.Errorf("after Previous: focus and location %q", got)
	}
	// A namespace being unbound holds no RoleBindings (rbac-sync removes them first): the
	// matrix leaves it out, and says so.
	if code, body := api.callFull(t, "admin", "/fleetstream.project.v1.ProjectService/BindNamespace", `{"project":"team-a","cluster":"dev-us","namespace":"tmp"}`); code != "" {
		t.Fatalf("bind tmp: %s %s", code, body)
	}
	b.run(t, "with tmp", b.load(base, "#/access?project=team-a"))
	b.waitPage(t, "access")
	if got := b.texts(t, "#access-matrix thead th"); !slices.Equal(got, []string{"Subject", "dev-us/tmp", "dev-us/web", "prod-eu/web"}) {
		t.Errorf("matrix columns with tmp bound %q", got)
	}
	if code, body := api.callFull(t, "admin", "/fleetstream.project.v1.ProjectService/UnbindNamespace", `{"project":"team-a","cluster":"dev-us","namespace":"tmp"}`); code != "" {
		t.Fatalf("unbind tmp: %s %s", code, body)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		b.run(t, "tmp unbinding", b.load(base, "#/access?project=team-a"))
		b.waitPage(t, "access")
		cols, status := b.texts(t, "#access-matrix thead th"), b.texts(t, "#access-status")
		if !slices.Equal(cols, []string{"Subject", "dev-us/web", "prod-eu/web"}) || len(status) != 1 || !strings.Contains(status[0], "1 namespace is left out") {
			return fmt.Errorf("with tmp unbinding: columns %q, status %q", cols, status)
		}
		return nil
	})
	if got := whoCanSubjects(t, api, "dev-us", "tmp"); len(got) != 0 {
		t.Errorf("WhoCan dev-us/tmp while it is unbound: %q", got)
	}
	// Markup as a moment in a link: the page's own error, as text.
	b.run(t, "markup as a time", b.load(base, "#/access?project=team-a&at="+url.QueryEscape(xss)))
	b.waitPage(t, "access")
	if got := b.texts(t, "#at-error"); len(got) != 1 || got[0] != "Not a time: "+xss {
		t.Errorf("at-error %q", got)
	}
	if imgs := eval[int](t, b, `document.querySelectorAll("img").length`); imgs != 0 {
		t.Errorf("%d img elements: markup was parsed", imgs)
	}
	b.noErrors(t, "access at")
}

// consoleProjectMembers: the Projects page lists the project's members and roles, grants a
// role after the dry run's preview, and revokes one after its own (Escape first: nothing
// changes); fleetd's ListProjectRoleBindings and WhoCan agree with the page.
func consoleProjectMembers(t *testing.T, b *browser, api *rawClient) {
	base := api.base
	members := func() []string {
		code, body := api.callFull(t, "admin", "/fleetstream.rbac.v1.RBACService/ListProjectRoleBindings", `{"project":"team-b"}`)
		if code != "" {
			t.Fatalf("ListProjectRoleBindings: %s %s", code, body)
		}
		var res struct {
			Bindings []struct {
				Subject      struct{ Kind, Name string }
				RoleTemplate string
			}
		}
		if err := json.Unmarshal(body, &res); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, b := range res.Bindings {
			out = append(out, b.Subject.Kind+":"+b.Subject.Name+"|"+b.RoleTemplate)
		}
		return out
	}
	const grant = "group:shop-devs|project-member"
	b.run(t, "team-b", b.load(base, "#/projects?project=team-b"))
	b.waitPage(t, "projects")
	if got := b.texts(t, "#no-members"); len(got) != 1 {
		t.Fatalf("team-b has no members; the page says %q", b.texts(t, "#members-section"))
	}
	// A ServiceAccount's namespace field opens with its kind, and the preview names it.
	if !eval[bool](t, b, `document.getElementById("grant-namespace").disabled`) {
		t.Error("the namespace field is open for a user")
	}
	b.run(t, "service account", chromedp.SetValue(chromedp.ID("grant-kind"), "SUBJECT_KIND_SERVICE_ACCOUNT"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("grant-kind").dispatchEvent(new Event("change"))`),
		chromedp.SetValue(chromedp.ID("grant-name"), "ci"), chromedp.SetValue(chromedp.ID("grant-namespace"), "build"),
		chromedp.SetValue(chromedp.ID("grant-template"), "project-viewer"), chromedp.Click(chromedp.ID("grant-preview")),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	if got := b.texts(t, "#plan tbody tr td:last-child"); !slices.Equal(got, []string{"ServiceAccount build/ci"}) {
		t.Errorf("preview for a ServiceAccount: subjects after %q", got)
	}
	b.run(t, "cancel", chromedp.Click(chromedp.ID("confirm-no")), chromedp.WaitNotVisible(chromedp.ID("confirm")))
	b.run(t, "grant", chromedp.SetValue(chromedp.ID("grant-kind"), "SUBJECT_KIND_GROUP"), chromedp.SetValue(chromedp.ID("grant-name"), "shop-devs"),
		chromedp.SetValue(chromedp.ID("grant-template"), "project-member"), chromedp.Click(chromedp.ID("grant-preview")),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	if got := b.texts(t, "#plan-summary"); len(got) != 1 || got[0] != "1 RoleBinding would change: 1 created." {
		t.Errorf("preview %q, want team-b's one namespace", got)
	}
	if got := b.texts(t, "#plan tbody tr td"); len(got) != 6 || got[0] != "prod-eu" || got[1] != "shop" || got[5] != "Group shop-devs" {
		t.Errorf("preview plan %q", got)
	}
	if got := eval[string](t, b, `document.activeElement.id`); got != "confirm-no" {
		t.Errorf("focus in the preview on %q, want the cancel button", got)
	}
	b.run(t, "confirm", chromedp.Click(chromedp.ID("confirm-yes")), chromedp.WaitVisible(chromedp.ID("grant-done")))
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := b.texts(t, `#members tr[data-member="`+grant+`"] > *`); len(got) != 4 || got[0] != "Group shop-devs" ||
			!strings.HasPrefix(got[1], "project-member") || !strings.HasSuffix(got[2], " by admin") {
			return fmt.Errorf("member row %q", got)
		}
		return nil
	})
	if got := members(); !slices.Equal(got, []string{"SUBJECT_KIND_GROUP:shop-devs|project-member"}) {
		t.Errorf("fleetd's team-b bindings %q", got)
	}
	if got := whoCanSubjects(t, api, "prod-eu", "shop"); !slices.Contains(got, grant) {
		t.Errorf("WhoCan prod-eu/shop %q lacks the page's grant", got)
	}
	b.screenshot(t, "projects-members")
	// Revoke: Escape first, nothing changes; then confirmed, it goes.
	b.run(t, "revoke, then escape", chromedp.Click(chromedp.CSS(`#members button[data-revoke="`+grant+`"]`)), chromedp.WaitVisible(chromedp.ID("confirm")))
	if got := b.texts(t, "#plan-summary"); len(got) != 1 || got[0] != "1 RoleBinding would change: 1 deleted." {
		t.Errorf("revoke preview %q", got)
	}
	b.run(t, "escape", chromedp.KeyEvent(kb.Escape), chromedp.WaitNotVisible(chromedp.ID("confirm")))
	// A call the page would send on Escape takes milliseconds on loopback: give it time to land.
	time.Sleep(300 * time.Millisecond)
	if got := members(); len(got) != 1 {
		t.Fatalf("after Escape fleetd's team-b bindings %q: the revoke was sent", got)
	}
	b.run(t, "revoke", chromedp.Click(chromedp.CSS(`#members button[data-revoke="`+grant+`"]`)), chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.Click(chromedp.ID("confirm-yes")), chromedp.WaitVisible(chromedp.ID("revoke-done")), chromedp.WaitVisible(chromedp.ID("no-members")))
	if got := members(); len(got) != 0 {
		t.Errorf("after the revoke fleetd's team-b bindings %q", got)
	}
	if got := whoCanSubjects(t, api, "prod-eu", "shop"); slices.Contains(got, grant) {
		t.Errorf("WhoCan prod-eu/shop %q still lists the revoked grant", got)
	}
	b.noErrors(t, "project members")
}
