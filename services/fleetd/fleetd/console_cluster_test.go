package fleetd_test

import (
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

// consoleClusterPage: a cluster's page, reached from the Fleet page by the keyboard, shows what
// the registry holds (conditions, labels, sets, taints, resources), the agent's namespaces and
// the namespace bindings on the cluster per project with phase and reason; the viewer sees only
// its project's bindings and is told the inventory is not its to read.
func consoleClusterPage(t *testing.T, b *browser, api *rawClient) {
	base := api.base
	b.run(t, "fleet", b.load(base, "#/fleet"))
	b.waitPage(t, "fleet")
	// The cluster's name on the Fleet page is a link: Tab to it and Enter.
	b.run(t, "open prod-eu", chromedp.Focus(chromedp.CSS(`tr[data-cluster="prod-eu"] th a`)), chromedp.KeyEvent(kb.Enter))
	b.waitPage(t, "clusters")
	if loc := eval[string](t, b, `location.hash`); loc != "#/clusters/prod-eu" {
		t.Errorf("location %q", loc)
	}
	if cur := eval[string](t, b, `document.querySelector("#nav [aria-current=page]")?.id || ""`); cur != "nav-fleet" {
		t.Errorf("the header marks %q as the current page, want nav-fleet", cur)
	}
	if got := b.texts(t, "#cluster-title"); !slices.Equal(got, []string{"Cluster prod-eu"}) {
		t.Errorf("title %q", got)
	}
	if got := b.texts(t, `#cluster-conditions tr[data-condition="AgentConnected"] > *`); len(got) != 5 || got[1] == "True" {
		t.Errorf("prod-eu's AgentConnected row %q: want it not True (no agent)", got)
	}
	labels := b.texts(t, "#cluster-labels .chip")
	sets := b.texts(t, "#cluster-sets .chip")
	if !slices.Equal(labels, []string{"env=prod", "region=eu"}) || !slices.Contains(sets, "production") {
		t.Errorf("labels %q and sets %q, want env=prod, region=eu and production", labels, sets)
	}
	// No agent has connected: the registry's own taint.
	if got := taintRows(t, b); !slices.Equal(got, []string{"fleetstream.io/unreachable||NoSelect"}) {
		t.Errorf("prod-eu's taints %q, want the unreachable taint", got)
	}
	// team-a's and team-b's bindings, with phase and reason, and the agent's inventory.
	testkit.Eventually(t, 10*time.Second, func() error {
		b.run(t, "reload", b.load(base, "#/clusters/prod-eu"))
		b.waitPage(t, "clusters")
		web := b.texts(t, `#cluster-bindings tr[data-binding="team-a/web"] > *`)
		shop := b.texts(t, `#cluster-bindings tr[data-binding="team-b/shop"] > *`)
		idle := b.texts(t, `#cluster-bindings tr[data-namespace="idle"] > *`)
		if len(web) != 6 || web[0] != "team-a" || web[1] != "web" || web[2] != "Pending" || !strings.Contains(web[4], "cpu: ? / 2") || web[5] != "Active" ||
			len(shop) != 6 || shop[0] != "team-b" || shop[5] != "Active" ||
			len(idle) != 6 || idle[0] != "no project" || idle[3] != "not bound to a project" || idle[5] != "Terminating" {
			return fmt.Errorf("bindings: web %q, shop %q, idle %q", web, shop, idle)
		}
		return nil
	})
	if got := b.texts(t, "#cluster-ns-status"); len(got) != 1 || !strings.Contains(got[0], "2 namespace bindings") || !strings.Contains(got[0], "reported 3 namespaces") {
		t.Errorf("namespace status %q", got)
	}
	if got := eval[string](t, b, `document.getElementById("cluster-activity").getAttribute("href")`); got != "#/activity?cluster=prod-eu" {
		t.Errorf("recent events link %q", got)
	}
	// Recent events: the audit trail's rows for prod-eu, newest first (the namespace bindings
	// made on it in the setup, after its registration).
	events := eval[[][]string](t, b, `[...document.querySelectorAll("#cluster-events tbody tr")].map(r => [...r.cells].map(c => c.textContent))`)
	t.Logf("prod-eu's recent events: %q", events)
	var what []string
	for _, e := range events {
		what = append(what, e[1]+" "+e[2]+" "+e[3])
	}
	if !slices.Equal(what, []string{"admin NamespaceBound project/team-b", "admin NamespaceBound project/team-a", "admin ClusterRegistered cluster/prod-eu"}) {
		t.Errorf("recent events %q, want team-b's and team-a's bindings, then the registration", events)
	}
	b.screenshot(t, "cluster")
	// dev-us: its taint and the resources its agent reported in a heartbeat.
	testkit.Eventually(t, 10*time.Second, func() error {
		b.run(t, "dev-us", b.load(base, "#/clusters/dev-us"))
		b.waitPage(t, "clusters")
		if got := b.texts(t, "#cluster-resources tbody tr"); !slices.Equal(got, []string{"cpu7800m8", "memory31Gi32Gi"}) {
			return fmt.Errorf("dev-us resources %q", got)
		}
		return nil
	})
	if got := taintRows(t, b); !slices.Contains(got, "maintenance|yes|NoSelect") {
		t.Errorf("dev-us taints %q, want maintenance=yes:NoSelect", got)
	}
	// A name in the location that is markup: the server's refusal, with the name as text.
	b.run(t, "markup name", b.load(base, "#/clusters/"+url.PathEscape(xss)))
	b.waitPage(t, "clusters")
	if got := b.texts(t, "#cluster-error"); len(got) != 1 || !strings.HasPrefix(got[0], "Cluster "+xss+": ") {
		t.Errorf("cluster error %q, want the name as text and the server's error", got)
	}
	if imgs := eval[int](t, b, `document.querySelectorAll("img").length`); imgs != 0 {
		t.Errorf("%d img elements: markup was parsed", imgs)
	}
	b.noErrors(t, "cluster page")
}

// taintRows returns the taints table's rows as key|value|effect.
func taintRows(t *testing.T, b *browser) []string {
	t.Helper()
	return eval[[]string](t, b, `[...document.querySelectorAll("#cluster-taints tbody tr")].map(r => [...r.cells].slice(0, 3).map(c => c.textContent).join("|"))`)
}
