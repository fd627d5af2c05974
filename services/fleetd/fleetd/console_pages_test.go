package fleetd_test

// The pages past Fleet and Projects, as subtests of TestConsoleInABrowser: each runs in the
// admin's signed-in browser session against the fleet consoleFleet set up.

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

// consolePlacementsPage checks the Placements page: web's explained decision (prod-eu selected with
// its scores and total, dev-us not in a bound set) and the page following the decision live.
func consolePlacementsPage(t *testing.T, b *browser, api *rawClient) {
	base := api.base
	// The decision comes from ExplainPlacement; the scheduler's views fill asynchronously,
	// so reload until the set's membership and both clusters are there.
	var prod, dev []string
	testkit.Eventually(t, 15*time.Second, func() error {
		b.run(t, "placements", b.load(base, "#/placements?project=team-a&placement=web"))
		b.waitPage(t, "placements")
		prod = b.texts(t, `#explanation tr[data-cluster="prod-eu"] > *`)
		dev = b.texts(t, `#explanation tr[data-cluster="dev-us"] > *`)
		if len(prod) < 5 || prod[1] != "Yes" || len(dev) < 5 || dev[1] != "No" {
			return fmt.Errorf("prod-eu %q, dev-us %q", prod, dev)
		}
		return nil
	})
	if got := b.texts(t, "#placements tbody th"); !slices.Equal(got, []string{"web"}) {
		t.Errorf("team-a's placements %q, want web", got)
	}
	// A column per active prioritizer (Additive: Balance and Steady), the total after them.
	prios := b.texts(t, "#explanation thead th[data-prioritizer]")
	if len(prios) == 0 || len(prod) != 5+len(prios) {
		t.Fatalf("prioritizer columns %q, prod-eu row %q", prios, prod)
	}
	if prod[2] != "1" || prod[len(prod)-1] != "" {
		t.Errorf("prod-eu: rank %q, reason %q; want rank 1 and no reason", prod[2], prod[len(prod)-1])
	}
	// Total is the weighted sum of the shown scores.
	var weights, scores []int
	for i, p := range prios {
		var w, sc int
		if _, err := fmt.Sscanf(p[strings.LastIndex(p, "×")+len("×"):], "%d", &w); err != nil {
			t.Fatalf("prioritizer header %q: %v", p, err)
		}
		if _, err := fmt.Sscanf(prod[3+i], "%d", &sc); err != nil {
			t.Fatalf("score %q: %v", prod[3+i], err)
		}
		weights, scores = append(weights, w), append(scores, sc)
	}
	total := 0
	for i := range weights {
		total += weights[i] * scores[i]
	}
	if prod[3+len(prios)] != fmt.Sprint(total) {
		t.Errorf("prod-eu total %q, want %d (scores %v × weights %v)", prod[3+len(prios)], total, scores, weights)
	}
	// dev-us is not in the production set: not scored, with the reason and the sets.
	why := dev[len(dev)-1]
	if dev[2] != "–" || !strings.Contains(why, "Not in a bound set") || !strings.Contains(why, "production") {
		t.Errorf("dev-us row %q: want unranked, not in a bound set, naming production", dev)
	}
	b.screenshot(t, "placements")
	b.noErrors(t, "placements page")

	// Live: dev-us joins the production set (its env label), the scheduler adds it, and the
	// open page shows it selected, without a reload; then it leaves again.
	_ = eval[int](t, b, `window.stillThisDocument = 1`)
	relabel := func(env string) {
		if code, body := api.callFull(t, "admin", "/fleetstream.cluster.v1.ClusterService/UpdateCluster",
			`{"name":"dev-us","labels":{"env":"`+env+`"},"updateMask":"labels"}`); code != "" {
			t.Fatalf("relabel dev-us env=%s: %s %s", env, code, body)
		}
	}
	devUs := func(want string) {
		t.Helper()
		testkit.Eventually(t, 15*time.Second, func() error {
			if got := b.texts(t, `#explanation tr[data-cluster="dev-us"] > *`); len(got) < 2 || got[1] != want {
				return fmt.Errorf("dev-us row %q, want selected %s", got, want)
			}
			return nil
		})
	}
	// Relabelled only once the page follows the decision: a change before the watch opened is
	// the page's business too (it explains again on the watch's first message), but "Live:"
	// is what says the page is following.
	testkit.Eventually(t, 15*time.Second, func() error {
		if got := b.texts(t, "#decision-live"); len(got) != 1 || !strings.HasPrefix(got[0], "Live:") {
			return fmt.Errorf("decision status %q, want Live:", got)
		}
		return nil
	})
	relabel("prod")
	devUs("Yes")
	if got := b.texts(t, "#decision-live"); len(got) != 1 || !strings.Contains(got[0], "added dev-us") {
		t.Errorf("live status %q, want the decision change that added dev-us", got)
	}
	relabel("dev")
	devUs("No")
	if eval[int](t, b, `window.stillThisDocument || 0`) != 1 {
		t.Error("the page reloaded to follow the decision")
	}
	b.noErrors(t, "placements live")
}

// consoleActivityPage makes a change as the user whose name is markup and finds it on the Activity
// page with its actor as text; the filters (keyboard, object link, time) and the server's paging.
func consoleActivityPage(t *testing.T, b *browser, api *rawClient) {
	base := api.base
	// A change by the user whose name is markup, with markup in a CEL expression the
	// Placements page shows in the reason: both must be text.
	cel, _ := json.Marshal(`managedCluster.metadata.name == "` + xss + `"`)
	if code, body := api.callFull(t, "markup", "/fleetstream.placement.v1.PlacementService/CreatePlacement",
		`{"placement":{"project":"team-a","name":"markup","tolerations":[{"operator":"Exists"}],"predicates":[{"requiredClusterSelector":{"celSelector":{"celExpressions":[`+string(cel)+`]}}}]}}`); code != "" {
		t.Fatalf("create placement markup as %s: %s %s", xss, code, body)
	}
	testkit.Eventually(t, 15*time.Second, func() error {
		b.run(t, "placements", b.load(base, "#/placements?project=team-a&placement=markup"))
		b.waitPage(t, "placements")
		prod := b.texts(t, `#explanation tr[data-cluster="prod-eu"] > *`)
		if len(prod) < 5 || !strings.Contains(prod[len(prod)-1], "No predicate matched") || !strings.Contains(prod[len(prod)-1], xss) {
			return fmt.Errorf("prod-eu row %q: want the CEL expression as text in the reason", prod)
		}
		return nil
	})
	if imgs := eval[int](t, b, `document.querySelectorAll("img").length`); imgs != 0 {
		t.Errorf("%d img elements on the placements page: markup was parsed", imgs)
	}
	b.noErrors(t, "placements with markup")

	// The change on the Activity page, filtered by its actor, the actor shown as text.
	var rows [][]string
	testkit.Eventually(t, 20*time.Second, func() error {
		b.run(t, "activity", b.load(base, "#/activity?"+url.Values{"actor": {xss}}.Encode()))
		b.waitPage(t, "activity")
		rows = eval[[][]string](t, b, `[...document.querySelectorAll("#activity tbody tr")].map(r => [...r.cells].map(c => c.textContent))`)
		for _, r := range rows {
			if len(r) == 7 && strings.Contains(r[2], "PlacementCreated") {
				return nil
			}
		}
		return fmt.Errorf("activity of %s: %q", xss, rows)
	})
	for _, r := range rows {
		if r[1] != xss {
			t.Errorf("row %q: actor %q, want only %q (the filter)", r, r[1], xss)
		}
	}
	if imgs := eval[int](t, b, `document.querySelectorAll("img").length`); imgs != 0 {
		t.Errorf("%d img elements on the activity page: markup was parsed", imgs)
	}
	if got := eval[string](t, b, `document.getElementById("f-actor").value`); got != xss {
		t.Errorf("actor filter input %q, want %q", got, xss)
	}
	b.screenshot(t, "activity")
	b.noErrors(t, "activity page")

	// The object link of a row filters by that object: only placement markup's rows.
	b.run(t, "object link", chromedp.Click(chromedp.CSS(`#activity tbody tr td:nth-child(4) a`)))
	testkit.Eventually(t, 5*time.Second, func() error {
		if got := eval[string](t, b, `document.getElementById("f-name")?.value ?? ""`); got != "markup" {
			return fmt.Errorf("name filter %q after following the object link", got)
		}
		objs := b.texts(t, "#activity tbody td:nth-child(4)")
		if len(objs) == 0 || slices.ContainsFunc(objs, func(o string) bool { return o != "placement/markup" }) {
			return fmt.Errorf("objects after following the link: %q", objs)
		}
		return nil
	})
	// Time: rows from the year 2999 on are none; an until before since is the server's
	// field error; a time that does not parse is the page's.
	for _, tc := range []struct{ query, empty, alert string }{
		{"since=2999-01-01T00:00", "No activity matches", ""},
		{"since=2026-11-27T12:00&until=2026-11-27T11:00", "", "until: must be after since"},
		{"since=" + url.QueryEscape(xss), "", "From: not a time: " + xss},
	} {
		b.run(t, tc.query, b.load(base, "#/activity?"+tc.query))
		b.waitPage(t, "activity")
		if tc.empty != "" {
			if got := b.texts(t, "#no-activity"); len(got) != 1 || !strings.Contains(got[0], tc.empty) || len(b.texts(t, "#activity tbody tr")) != 0 {
				t.Errorf("%s: %q and %d rows, want none", tc.query, got, len(b.texts(t, "#activity tbody tr")))
			}
		} else if got := b.texts(t, "#activity-error"); len(got) != 1 || !strings.Contains(got[0], tc.alert) {
			t.Errorf("%s: error %q, want %q", tc.query, got, tc.alert)
		}
	}
	if imgs := eval[int](t, b, `document.querySelectorAll("img").length`); imgs != 0 {
		t.Errorf("%d img elements: markup was parsed", imgs)
	}
	b.noErrors(t, "activity filters")

	// Filtering from the keyboard: type an actor into the form and press Enter.
	b.run(t, "filter by admin", chromedp.Focus(chromedp.ID("f-actor")),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("f-actor").value = ""`),
		chromedp.SendKeys(chromedp.ID("f-actor"), "admin"+kb.Enter))
	testkit.Eventually(t, 5*time.Second, func() error {
		actors := b.texts(t, "#activity tbody td.actor")
		if len(actors) == 0 || slices.ContainsFunc(actors, func(a string) bool { return a != "admin" }) {
			return fmt.Errorf("actors after filtering by admin: %q", actors)
		}
		return nil
	})

	// Paging by the server's token: page 2 continues where page 1 stopped.
	b.run(t, "page 1", b.load(base, "#/activity?actor=admin&size=3"))
	b.waitPage(t, "activity")
	first := eval[[]string](t, b, `[...document.querySelectorAll("#activity tbody tr")].map(r => r.dataset.activity)`)
	if len(first) == 0 || len(first) > 3 {
		t.Fatalf("page 1 of size 3: rows %q", first)
	}
	b.run(t, "next page", chromedp.Click(chromedp.ID("next-page")))
	var second []string
	testkit.Eventually(t, 5*time.Second, func() error {
		if eval[int](t, b, `document.querySelectorAll("#first-page").length`) == 0 {
			return fmt.Errorf("not on page 2 yet")
		}
		second = eval[[]string](t, b, `[...document.querySelectorAll("#activity tbody tr")].map(r => r.dataset.activity)`)
		return nil
	})
	if len(second) == 0 || slices.ContainsFunc(second, func(id string) bool { return slices.Contains(first, id) }) {
		t.Errorf("page 2 rows %q repeat or miss page 1's %q", second, first)
	}
	if strings.Contains(eval[string](t, b, `location.href`), "token-") {
		t.Error("a token in the location")
	}
	b.noErrors(t, "activity paging")
}

// consoleTrafficPage checks the Traffic page: shares from the agents' reports, markup from the
// clusters as text, a weight change shown live, and a drain after its confirmation.
func consoleTrafficPage(t *testing.T, b *browser, api *rawClient) {
	base := api.base
	share := func() map[string]string {
		out := map[string]string{}
		for _, r := range eval[[][]string](t, b, `[...document.querySelectorAll("#traffic-clusters tbody tr")].map(r => [r.dataset.cluster, r.cells[4].textContent.trim()])`) {
			out[r[0]] = r[1]
		}
		return out
	}
	testkit.Eventually(t, 15*time.Second, func() error {
		b.run(t, "traffic", b.load(base, "#/traffic?namespace=web&service=api"))
		b.waitPage(t, "traffic")
		if got := share(); got["prod-eu"] != "66.7%" || got["dev-us"] != "33.3%" {
			return fmt.Errorf("shares %v, want prod-eu 66.7%% and dev-us 33.3%%", got)
		}
		return nil
	})
	if got := b.texts(t, "#traffic-endpoints tbody tr"); len(got) != 3 {
		t.Errorf("endpoint rows %q, want 3", got)
	}
	cells := b.texts(t, `#traffic-endpoints tr[data-address="dev-us/10.2.0.1:8080"] td`)
	if len(cells) != 9 || cells[5] != "33.3%" || cells[6] != xss || cells[7] != xss || cells[8] != "Pod/"+xss {
		t.Errorf("dev-us endpoint row %q: want share 33.3%% and zone, node and target as text", cells)
	}
	if imgs := eval[int](t, b, `document.querySelectorAll("img").length`); imgs != 0 {
		t.Errorf("%d img elements on the traffic page: markup was parsed", imgs)
	}
	b.screenshot(t, "traffic")

	// A weight change through the API shows on the open page, with no reload, by the watch.
	_ = eval[int](t, b, `window.stillThisDocument = 1`)
	start := time.Now()
	if code, body := api.callFull(t, "admin", "/fleetstream.endpoint.v1.EndpointService/SetClusterWeight",
		`{"namespace":"web","name":"api","cluster":"dev-us","weight":400}`); code != "" {
		t.Fatalf("set dev-us's weight: %s %s", code, body)
	}
	var shown time.Duration
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := share(); got["dev-us"] != "66.7%" || got["prod-eu"] != "33.3%" {
			return fmt.Errorf("shares %v, want dev-us 66.7%% (400 of 600) and prod-eu 33.3%%", got)
		}
		shown = time.Since(start)
		return nil
	})
	if eval[int](t, b, `window.stillThisDocument || 0`) != 1 {
		t.Error("the page reloaded to show the weight")
	}
	t.Logf("weight change on screen %v after the call was made (limit 1s)", shown.Round(time.Millisecond))
	if timed() && shown > time.Second {
		t.Errorf("the weight change took %v to show, over 1 s", shown)
	}
	// Drain dev-us from the page: a confirmation says what the shares become; Escape
	// cancels it (nothing changes), the confirm button sets the weight.
	b.run(t, "drain, then cancel", chromedp.SetValue(chromedp.ID("weight-cluster"), "dev-us"), chromedp.Click(chromedp.ID("weight-drain")),
		chromedp.WaitVisible(chromedp.ID("confirm")))
	if q := b.texts(t, "#confirm-text"); len(q) != 1 || !strings.Contains(q[0], "on dev-us from 400 to 0") || !strings.Contains(q[0], "dev-us 0.0%, prod-eu 100.0%") {
		t.Errorf("confirmation %q: want dev-us from 400 to 0 and the shares after", q)
	}
	if got := eval[string](t, b, `document.activeElement.id`); got != "confirm-no" {
		t.Errorf("focus in the confirmation on %q, want the cancel button", got)
	}
	b.run(t, "escape", chromedp.KeyEvent(kb.Escape), chromedp.WaitNotVisible(chromedp.ID("confirm")))
	// The shares alone could not tell: a confirmed drain's call would not have come back
	// through the watch yet. The confirm handler writes its "Setting…" note at once.
	if note := b.texts(t, "#weight-note"); len(note) > 1 || len(note) == 1 && note[0] != "" {
		t.Errorf("after cancelling, the weight note says %q: the drain was sent", note)
	}
	if got := share(); got["dev-us"] != "66.7%" {
		t.Errorf("after cancelling, shares %v", got)
	}
	b.run(t, "drain", chromedp.Click(chromedp.ID("weight-drain")), chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.Click(chromedp.ID("confirm-yes")))
	testkit.Eventually(t, 10*time.Second, func() error {
		if got := share(); got["dev-us"] != "0.0%" || got["prod-eu"] != "100.0%" {
			return fmt.Errorf("shares after draining dev-us %v", got)
		}
		return nil
	})
	if got := b.texts(t, `#traffic-clusters tr[data-cluster="dev-us"] td`); len(got) < 1 || got[0] != "0 (drained)" {
		t.Errorf("dev-us's weight cell %q, want 0 (drained)", got)
	}
	b.screenshot(t, "traffic-drained")
	// Moving on stops the stream: no error from the aborted watch.
	b.run(t, "fleet", chromedp.Click(chromedp.ID("nav-fleet")))
	testkit.Eventually(t, 5*time.Second, func() error {
		if n := len(b.texts(t, "#clusters tbody tr")); n != 2 {
			return fmt.Errorf("fleet rows %d", n)
		}
		return nil
	})
	b.noErrors(t, "traffic page")
}
