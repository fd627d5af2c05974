package cli

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// TestPlacementEndToEnd runs the commands against the real namespace-binding: clusters in a
// bound set, a placement from an OCM file, its decision with scores, add-on scores that change
// it, a namespace that follows it, and an update that moves it.
func TestPlacementEndToEnd(t *testing.T) {
	h := startHub(t)
	for c, region := range map[string]string{"eu-1": "eu", "eu-2": "eu", "us-1": "us"} {
		h.run(t, "cluster", "register", c, "--label", "region="+region).ok(t)
	}
	h.run(t, "project", "create", "team-a").ok(t)
	h.run(t, "clusterset", "bind", "global", "--project", "team-a").ok(t)

	// The clusters have no agent, so they carry fleetstream.io/unreachable: tolerate every
	// taint.
	file := filepath.Join(t.TempDir(), "placement.yaml")
	writeFile(t, file, `apiVersion: cluster.open-cluster-management.io/v1beta1
kind: Placement
metadata: {name: best-eu, namespace: team-a}
spec:
  numberOfClusters: 1
  predicates:
  - requiredClusterSelector:
      labelSelector: {matchLabels: {region: eu}}
  tolerations:
  - operator: Exists
  prioritizerPolicy:
    mode: Additive
    configurations:
    - scoreCoordinate: {type: AddOn, addOn: {resourceName: usage, scoreName: free}}
      weight: 2
`)
	r := h.run(t, "placement", "create", "-f", file).ok(t)
	for _, want := range []string{"PROJECT", "team-a", "best-eu", "<all bound>"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("create output lacks %q:\n%s", want, r.stdout)
		}
	}
	h.run(t, "placement", "create", "-f", file).fails(t, "error: already_exists: ")

	type decisionsJSON struct {
		Prioritizers []struct {
			Name   string `json:"name"`
			Weight int32  `json:"weight"`
		} `json:"prioritizers"`
		Groups []struct {
			Pages []struct {
				Clusters []struct {
					ClusterName string `json:"clusterName"`
				} `json:"clusters"`
			} `json:"pages"`
		} `json:"groups"`
	}
	decided := func(d decisionsJSON) string {
		var out []string
		for _, g := range d.Groups {
			for _, p := range g.Pages {
				for _, c := range p.Clusters {
					out = append(out, c.ClusterName)
				}
			}
		}
		return strings.Join(out, ",")
	}
	waitDecided := func(want string) decisionsJSON {
		t.Helper()
		var d decisionsJSON
		testkit.Eventually(t, 10*time.Second, func() error {
			d = jsonOf[decisionsJSON](t, h.run(t, "-o", "json", "placement", "decisions", "best-eu", "--project", "team-a").ok(t))
			if got := decided(d); got != want {
				return errorString("decided " + got + ", want " + want)
			}
			return nil
		})
		return d
	}
	// Equal scores: ties go by name.
	d := waitDecided("eu-1")
	weights := map[string]int32{}
	for _, p := range d.Prioritizers {
		weights[p.Name] = p.Weight
	}
	if want := map[string]int32{"Balance": 1, "Steady": 1, "AddOn/usage/free": 2}; !maps.Equal(weights, want) {
		t.Errorf("prioritizers %v, want %v", weights, want)
	}

	// Add-on scores outweigh Steady: eu-2 takes eu-1's place.
	h.run(t, "addonscore", "set", "eu-2", "usage", "free", "90", "--valid-for", "1h").ok(t)
	r = h.run(t, "addonscore", "set", "--", "eu-1", "usage", "free", "-90").ok(t)
	if !strings.Contains(r.stdout, "-90") || !strings.Contains(r.stdout, "<until replaced>") {
		t.Errorf("addonscore set output:\n%s", r.stdout)
	}
	waitDecided("eu-2")
	r = h.run(t, "placement", "decisions", "team-a/best-eu").ok(t)
	for _, want := range []string{"GROUP", "CLUSTER", "Balance(w=1)", "Steady(w=1)", "AddOn/usage/free(w=2)", "TOTAL", "eu-2", "90", "PlacementSatisfied=True",
		"next evaluation 20"} { // eu-2's score is valid for 1h: that is a timer
		if !strings.Contains(r.stdout, want) {
			t.Errorf("decisions table lacks %q:\n%s", want, r.stdout)
		}
	}
	r = h.run(t, "placement", "list", "-p", "team-a").ok(t)
	if !strings.Contains(r.stdout, "best-eu") || !strings.Contains(r.stdout, "True") {
		t.Errorf("list:\n%s", r.stdout)
	}
	h.run(t, "placement", "get", "nope", "-p", "team-a").fails(t, "error: not_found: ")

	// A namespace follows the placement, and the placement cannot go while it does.
	h.run(t, "namespace", "bind", "web", "-p", "team-a", "--placement", "best-eu").ok(t)
	testkit.Eventually(t, 10*time.Second, func() error {
		r := h.run(t, "namespace", "list", "-p", "team-a").ok(t)
		if !strings.Contains(r.stdout, "eu-2") || strings.Contains(r.stdout, "eu-1") {
			return errorString("web not bound on exactly eu-2:\n" + r.stdout)
		}
		return nil
	})
	h.run(t, "placement", "delete", "team-a/best-eu").fails(t, "error: failed_precondition: ")
	h.run(t, "namespace", "unbind", "web", "-p", "team-a", "--placement", "best-eu").ok(t)

	// update replaces the whole spec: another predicate, no numberOfClusters.
	writeFile(t, file, "metadata: {name: best-eu}\nspec: {predicates: [{requiredClusterSelector: {labelSelector: {matchLabels: {region: us}}}}], tolerations: [{operator: Exists}]}\n")
	h.run(t, "placement", "update", "-f", file, "-p", "team-a").ok(t)
	waitDecided("us-1")

	h.run(t, "placement", "delete", "best-eu", "-p", "team-a").ok(t)
	h.run(t, "placement", "get", "team-a/best-eu").fails(t, "error: not_found: ")
}
