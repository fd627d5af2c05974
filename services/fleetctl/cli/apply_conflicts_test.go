package cli

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
)

// TestApplyConflicts runs field ownership against the real cluster-import and
// namespace-binding: two apply sets fighting over a quota, a change made with fleetctl (a
// direct API call) since a set applied, --force-conflicts taking the fields over, a manifest
// change over an untouched live value (no conflict), and fields released when the manifest no
// longer sets them. Every refused apply writes nothing, for any object.
func TestApplyConflicts(t *testing.T) {
	h := startHub(t)
	dir := t.TempDir()
	records := filepath.Join(dir, "records")
	doc := func(kind, meta, spec string) string {
		return "---\napiVersion: fleetstream.io/v1alpha1\nkind: " + kind + "\nmetadata: " + meta + "\nspec: " + spec + "\n"
	}
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		writeFile(t, p, content)
		return p
	}
	apply := func(set, path string, extra ...string) result {
		t.Helper()
		return h.run(t, append([]string{"apply", "-f", path, "--applyset", set, "--applyset-records", records, "--token-dir", filepath.Join(dir, "tokens")}, extra...)...)
	}
	quota := func(ns string) string {
		t.Helper()
		for _, b := range jsonOf[[]bindingJSON](t, h.run(t, "-o", "json", "namespace", "list", "--project", "team-a").ok(t)) {
			if b.Namespace == ns {
				return b.Hard["cpu"]
			}
		}
		return "(not bound)"
	}
	const web = "NamespaceBinding/team-a/cluster=eu-1/web"

	platform := file("platform.yaml", doc("Cluster", "{name: eu-1}", "{}")+
		doc("Project", "{name: team-a}", `{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: "8"}}]}`)+
		doc("NamespaceBinding", "{name: web, project: team-a}", `{cluster: eu-1, hard: {cpu: "2"}}`))
	if r := h.run(t, "apply", "-f", platform, "--force-conflicts"); r.code != 1 || !strings.Contains(r.stderr, "apply only with --applyset") {
		t.Fatalf("--force-conflicts without an apply set: exit %d\n%s", r.code, r.stderr)
	}
	// The set names its record file: a name that would reach outside the directory is refused.
	writeFile(t, filepath.Join(dir, "outside.json"), `{"applySet": "x", "objects": {}}`)
	if r := h.run(t, "diff", "-f", platform, "--applyset", "../outside", "--applyset-records", records); r.code != 2 || !strings.Contains(r.stderr, `--applyset "../outside": want a DNS label`) {
		t.Fatalf("diff with a set name outside the records: exit %d\n%s", r.code, r.stderr)
	}
	apply("platform", platform).ok(t)

	// A second set declares the same quota: the first set's field, so a conflict, and nothing
	// is written — not even the binding it would create.
	webTeam := file("web-team.yaml", doc("NamespaceBinding", "{name: web, project: team-a}", `{cluster: eu-1, hard: {cpu: "4"}}`)+
		doc("NamespaceBinding", "{name: api, project: team-a}", `{cluster: eu-1, hard: {cpu: "1"}}`))
	wantConflict := web + `: spec.hard.cpu: set by apply set platform, not by this apply set; live "2", manifest "4"`
	for _, extra := range [][]string{nil, {"--dry-run"}} {
		r := apply("web-team", webTeam, extra...)
		if r.code != 1 || !strings.Contains(r.stderr, wantConflict+"\n") || !strings.Contains(r.stderr, "1 of 2 objects conflict") ||
			!strings.Contains(r.stderr, "nothing was changed") || !strings.Contains(r.stderr, "--force-conflicts") || strings.Contains(r.stdout, "created") {
			t.Fatalf("apply %v of another set's field: exit %d\n%s%s", extra, r.code, r.stdout, r.stderr)
		}
	}
	r := h.run(t, "diff", "-f", webTeam, "--applyset", "web-team", "--applyset-records", records)
	if r.code != 2 || !strings.Contains(r.stderr, wantConflict+"\n") || !strings.Contains(r.stdout, "+    cpu: \"4\"\n") {
		t.Fatalf("diff of another set's field: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// With --force-conflicts diff says what apply would then do: change something (1).
	if r := h.run(t, "diff", "-f", webTeam, "--applyset", "web-team", "--applyset-records", records, "--force-conflicts"); r.code != 1 || !strings.Contains(r.stderr, "(taken over: --force-conflicts)") {
		t.Fatalf("diff --force-conflicts: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if q := quota("web"); q != "2" {
		t.Fatalf("a refused apply changed the quota to %s", q)
	}
	if q := quota("api"); q != "(not bound)" {
		t.Fatalf("a refused apply bound api (quota %s)", q)
	}

	// --force-conflicts takes the field over; a rerun is then clean.
	r = apply("web-team", webTeam, "--force-conflicts").ok(t)
	// Its first apply: what it configures was checked against the recorded sets only, and
	// it says so.
	if r.stdout != web+" configured\nNamespaceBinding/team-a/cluster=eu-1/api created\n" || !strings.Contains(r.stderr, `live "2", manifest "4" (taken over: --force-conflicts)`) ||
		!strings.Contains(r.stderr, "apply set web-team has no record of what it applied ("+filepath.Join(records, "web-team.json")+"): 1 existing object(s) are configured") {
		t.Fatalf("apply --force-conflicts:\n%s%s", r.stdout, r.stderr)
	}
	if q := quota("web"); q != "4" {
		t.Fatalf("quota after --force-conflicts: %s, want 4", q)
	}
	if r := apply("web-team", webTeam); r.code != 0 || strings.Count(r.stdout, " unchanged\n") != 2 || r.stderr != "" {
		t.Fatalf("rerun after taking over: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// The first set now finds its field changed by the second.
	r = apply("platform", platform)
	if r.code != 1 || !strings.Contains(r.stderr, web+`: spec.hard.cpu: changed by apply set web-team since this apply set last applied it; live "4", manifest "2"`+"\n") {
		t.Fatalf("apply of a field another set took: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A change made with fleetctl (a direct API call) since the set applied: a conflict that
	// stops every object of the apply, including one with nothing in conflict.
	h.run(t, "namespace", "quota", "web", "--project", "team-a", "--cluster", "eu-1", "--hard", "cpu=3").ok(t)
	api2 := doc("NamespaceBinding", "{name: api, project: team-a}", `{cluster: eu-1, hard: {cpu: "2"}}`)
	webTeam2 := file("web-team-2.yaml", doc("NamespaceBinding", "{name: web, project: team-a}", `{cluster: eu-1, hard: {cpu: "4"}}`)+api2)
	r = apply("web-team", webTeam2)
	if r.code != 1 || !strings.Contains(r.stderr, web+`: spec.hard.cpu: changed by `+otherWriter+` since this apply set last applied it; live "3", manifest "4"`+"\n") {
		t.Fatalf("apply after a direct change: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if q := quota("api"); q != "1" {
		t.Fatalf("a refused apply changed another object: api's quota is %s, want 1", q)
	}
	r = apply("web-team", webTeam2, "--force-conflicts").ok(t)
	if q, qa := quota("web"), quota("api"); q != "4" || qa != "2" {
		t.Fatalf("after --force-conflicts: web %s api %s, want 4 and 2\n%s%s", q, qa, r.stdout, r.stderr)
	}

	// The set changes its own field, which nobody touched since: no conflict.
	webTeam3 := file("web-team-3.yaml", doc("NamespaceBinding", "{name: web, project: team-a}", `{cluster: eu-1, hard: {cpu: "5"}}`)+api2)
	if r := apply("web-team", webTeam3); r.code != 0 || !strings.Contains(r.stdout, web+" configured\n") || r.stderr != "" {
		t.Fatalf("apply of the set's own field: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Released: the platform set stops declaring the budget it applied (nobody changed it)
	// and the quota it lost to the web team; the budget goes, the quota stays the web team's.
	platform2 := file("platform-2.yaml", doc("Cluster", "{name: eu-1}", "{}")+doc("Project", "{name: team-a}", "{displayName: A}"))
	r = apply("platform", platform2).ok(t)
	if !strings.Contains(r.stdout, "Project/team-a configured\n") || r.stderr != "" {
		t.Fatalf("apply releasing a budget:\n%s%s", r.stdout, r.stderr)
	}
	if out := h.run(t, "export", "--kind", "Project").ok(t).stdout; strings.Contains(out, "budgets") {
		t.Fatalf("the released budget is still there:\n%s", out)
	}
	if q := quota("web"); q != "5" {
		t.Fatalf("the platform set's apply changed the web team's quota to %s", q)
	}
	// A budget set since by someone else is theirs: the manifest not setting it is no licence
	// to remove it.
	h.run(t, "project", "budget", "team-a", "--cluster", "eu-1", "--hard", "cpu=20").ok(t)
	r = apply("platform", platform2)
	if r.code != 1 || !strings.Contains(r.stderr, `Project/team-a: spec.budgets[cluster=eu-1].hard.cpu: set by `+otherWriter+`, not by this apply set; live "20", manifest does not set it (apply would remove it)`) {
		t.Fatalf("apply over someone else's budget: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestApplySetOwnsEveryKind: an apply set that changes only its own fields meets no conflict,
// for every kind (taints and budgets by key, rules and tolerations whole, an import policy's
// template); a claim changed with fleetctl since is one.
func TestApplySetOwnsEveryKind(t *testing.T) {
	h := startRBACHub(t)
	dir := t.TempDir()
	records := filepath.Join(dir, "records")
	apply := func(content string, extra ...string) result {
		t.Helper()
		path := filepath.Join(dir, "fleet.yaml")
		writeFile(t, path, content)
		return h.run(t, append([]string{"apply", "-f", path, "--applyset", "prod", "--applyset-records", records, "--token-dir", filepath.Join(dir, "tokens")}, extra...)...)
	}
	apply(fleetManifests).ok(t)
	if r := apply(fleetManifests).ok(t); strings.Count(r.stdout, " unchanged\n") < 13 || r.stderr != "" {
		t.Fatalf("rerun:\n%s%s", r.stdout, r.stderr)
	}
	changed := strings.NewReplacer(
		"labels: {region: eu, tier: gold}", "labels: {region: eu}",
		`value: "true", effect: TAINT_EFFECT_NO_SELECT_IF_NEW`, `value: "false", effect: TAINT_EFFECT_NO_SELECT_IF_NEW`,
		"cluster: eu-1\n  hard: {cpu: \"2\"}", "cluster: eu-1\n  hard: {cpu: \"4\"}",
		"hard: {cpu: \"8\"}", "hard: {cpu: \"16\"}",
		"verbs: [get, list]", "verbs: [get, list, watch]",
		"numberOfClusters: 1", "numberOfClusters: 2",
		"{operator: Exists}", "{key: gpu, operator: Exists}",
		"labels: {provider: capi}", "labels: {provider: cluster-api}",
	).Replace(fleetManifests)
	r := apply(changed).ok(t)
	for _, line := range []string{"Cluster/eu-1 configured", "RoleTemplate/reader configured", "Project/team-a configured", "Placement/team-a/best-eu configured", "ImportPolicy/capi configured", "NamespaceBinding/team-a/cluster=eu-1/web configured"} {
		if !strings.Contains(r.stdout, line+"\n") {
			t.Errorf("apply of the set's own changes lacks %q:\n%s", line, r.stdout)
		}
	}
	if r.stderr != "" {
		t.Errorf("apply of the set's own changes said:\n%s", r.stderr)
	}

	h.run(t, "cluster", "update", "eu-1", "--claim", "cloud=gcp").ok(t)
	r = apply(changed)
	if r.code != 1 || !strings.Contains(r.stderr, "Cluster/eu-1: spec.claims.cloud: changed by "+otherWriter+` since this apply set last applied it; live "gcp", manifest "aws"`+"\n") {
		t.Fatalf("apply after a claim changed by hand: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestApplyConflictOfEveryKind: another writer changes, through the API, a field an apply set
// applied and one it never applied, for every kind whose objects another writer can change
// (conflictCase says what the set's next apply must do). Each case starts from the fleet as
// the set declares it: the previous case's --force-conflicts put it back.
func TestApplyConflictOfEveryKind(t *testing.T) {
	h := startRBACHub(t)
	dir := t.TempDir()
	records := filepath.Join(dir, "records")
	fleet := filepath.Join(dir, "fleet.yaml")
	writeFile(t, fleet, fleetManifests)
	run := func(cmd string, extra ...string) result {
		t.Helper()
		args := []string{cmd, "-f", fleet, "--applyset", "prod", "--applyset-records", records}
		if cmd == "apply" {
			args = append(args, "--token-dir", filepath.Join(dir, "tokens"))
		}
		return h.run(t, append(args, extra...)...)
	}
	run("apply").ok(t)
	// The namespace that follows the placement is listed once the scheduler has decided.
	waitFor(t, 30*time.Second, "the fleet as declared", func() bool { return run("diff").code == 0 })

	ctx := context.Background()
	opt := connect.WithInterceptors(bearerAuth{token: e2eToken})
	sets := placementv1connect.NewClusterSetServiceClient(http.DefaultClient, h.url, opt)
	placements := placementv1connect.NewPlacementServiceClient(http.DefaultClient, h.url, opt)
	policies := clusterv1connect.NewImportPolicyServiceClient(http.DefaultClient, h.url, opt)
	subscribers := clusterv1connect.NewSubscriberServiceClient(http.DefaultClient, h.url, opt)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	const (
		changedSince = "changed by " + otherWriter + " since this apply set last applied it; "
		neverApplied = "set by " + otherWriter + ", not by this apply set; "
	)
	// ClusterSetBinding and ProjectRoleBinding have no case: what they declare is what they
	// bind (their key), so another writer cannot change a field of one; it can only unbind it
	// (apply then creates it again) or bind another (another object, which apply leaves alone).
	for _, c := range []conflictCase{
		{
			kind: "Cluster",
			write: func(t *testing.T) {
				h.run(t, "cluster", "update", "eu-1", "--claim", "cloud=gcp", "--claim", "zone=b").ok(t)
			},
			written: []string{"cloud: gcp", "zone: b"},
			want: []string{
				`fleet.yaml:1: document 1: Cluster/eu-1: spec.claims.cloud: ` + changedSince + `live "gcp", manifest "aws"`,
				`fleet.yaml:1: document 1: Cluster/eu-1: spec.claims.zone: ` + neverApplied + `live "b", manifest does not set it (apply would remove it)`,
			},
			forced: func(t *testing.T) {
				// The registry's own taint is no field of the manifest: apply never owned it,
				// and taking the claims over leaves it.
				if c := jsonOf[clusterJSON](t, h.run(t, "-o", "json", "cluster", "get", "eu-1").ok(t)); !strings.Contains(fmt.Sprint(c.Taints), "fleetstream.io/unreachable") {
					t.Errorf("the registry's taint is gone after --force-conflicts: %+v", c.Taints)
				}
			},
		},
		{
			kind: "Project",
			write: func(t *testing.T) {
				h.run(t, "project", "budget", "team-a", "--cluster", "eu-1", "--hard", "cpu=20").ok(t)
				// A budget on a cluster where the project holds no namespace yet (one with a
				// namespace lacking a cpu quota would refuse it).
				h.run(t, "cluster", "register", "eu-9").ok(t)
				h.run(t, "project", "budget", "team-a", "--cluster", "eu-9", "--hard", "cpu=1").ok(t)
			},
			written: []string{`cpu: "20"`, "cluster: eu-9"},
			want: []string{
				`Project/team-a: spec.budgets[cluster=eu-1].hard.cpu: ` + changedSince + `live "20", manifest "8"`,
				`Project/team-a: spec.budgets[cluster=eu-9].hard.cpu: ` + neverApplied + `live "1", manifest does not set it (apply would remove it)`,
			},
		},
		{
			kind: "NamespaceBinding",
			write: func(t *testing.T) {
				h.run(t, "namespace", "quota", "web", "--project", "team-a", "--cluster", "eu-1", "--hard", "cpu=3", "--hard", "memory=1Gi").ok(t)
			},
			written: []string{`cpu: "3"`, "memory: 1Gi"},
			want: []string{
				`NamespaceBinding/team-a/cluster=eu-1/web: spec.hard.cpu: ` + changedSince + `live "3", manifest "2"`,
				`NamespaceBinding/team-a/cluster=eu-1/web: spec.hard.memory: ` + neverApplied + `live "1Gi", manifest does not set it (apply would remove it)`,
			},
		},
		{
			kind: "RoleTemplate",
			write: func(t *testing.T) {
				h.run(t, "role", "update", "reader", "--rule", "get:pods").ok(t)
				h.run(t, "role", "update", "operator", "--display-name", "Ops").ok(t)
			},
			written: []string{"displayName: Ops"},
			gone:    []string{"- list\n"},
			want: []string{
				`RoleTemplate/reader: spec.rules: ` + changedSince + `live [{"apiGroups":[""],"resources":["pods"],"verbs":["get"]}], manifest [{"apiGroups":[""],"resources":["pods"],"verbs":["get","list…`,
				`RoleTemplate/operator: spec.displayName: ` + neverApplied + `live "Ops", manifest does not set it (apply would remove it)`,
			},
		},
		{
			kind: "ImportPolicy",
			write: func(t *testing.T) {
				res, err := policies.GetImportPolicy(ctx, connect.NewRequest(&clusterv1.GetImportPolicyRequest{Name: "capi"}))
				if err != nil {
					t.Fatal(err)
				}
				p := res.Msg.Policy
				p.NameTemplate = "imported-{{ .source.metadata.name }}"
				p.References = append(p.References, &clusterv1.ImportReference{Key: "ca", Version: "v1", Resource: "configmaps",
					NamespaceTemplate: "{{ .source.metadata.namespace }}", NameTemplate: "ca"})
				must(policies.UpdateImportPolicy(ctx, connect.NewRequest(&clusterv1.UpdateImportPolicyRequest{Policy: p})))
			},
			written: []string{"nameTemplate: imported-", "key: ca"},
			want: []string{
				`ImportPolicy/capi: spec.nameTemplate: ` + changedSince + `live "imported-{{ .source.metadata.name }}", manifest "{{ .source.metadata.name }}"`,
				`ImportPolicy/capi: spec.references[key=ca].resource: ` + neverApplied + `live "configmaps", manifest does not set it (apply would remove it)`,
			},
		},
		{
			kind: "Placement",
			write: func(t *testing.T) {
				res, err := placements.GetPlacement(ctx, connect.NewRequest(&placementv1.GetPlacementRequest{Project: "team-a", Name: "best-eu"}))
				if err != nil {
					t.Fatal(err)
				}
				p := res.Msg.Placement
				p.NumberOfClusters = proto.Int32(3)
				p.PrioritizerPolicy = &placementv1.PrioritizerPolicy{Mode: "Exact"}
				must(placements.UpdatePlacement(ctx, connect.NewRequest(&placementv1.UpdatePlacementRequest{Placement: p})))
			},
			written: []string{"numberOfClusters: 3", "mode: Exact"},
			want: []string{
				`Placement/team-a/best-eu: spec.numberOfClusters: ` + changedSince + `live 3, manifest 1`,
				`Placement/team-a/best-eu: spec.prioritizerPolicy.mode: ` + neverApplied + `live "Exact", manifest does not set it (apply would remove it)`,
			},
		},
		{
			// A subscriber's streams cannot be changed, so another writer can only delete it and
			// create it again with other streams. That is no conflict --force-conflicts could
			// take over: apply refuses the change the API cannot make, forced or not.
			kind: "Subscriber",
			write: func(t *testing.T) {
				must(subscribers.DeleteSubscriber(ctx, connect.NewRequest(&clusterv1.DeleteSubscriberRequest{Name: "audit"})))
				must(subscribers.CreateSubscriber(ctx, connect.NewRequest(&clusterv1.CreateSubscriberRequest{Name: "audit", Streams: []string{"FLEET_NS"}})))
			},
			gone:    []string{"FLEET_RBAC"},
			refused: "Subscriber/audit: spec.streams: a subscriber's streams cannot be changed; delete it through the API (SubscriberService.DeleteSubscriber: prune never deletes subscribers",
			restore: func(t *testing.T) {
				must(subscribers.DeleteSubscriber(ctx, connect.NewRequest(&clusterv1.DeleteSubscriberRequest{Name: "audit"})))
				must(subscribers.CreateSubscriber(ctx, connect.NewRequest(&clusterv1.CreateSubscriberRequest{Name: "audit", Streams: []string{"FLEET_RBAC", "FLEET_NS"}})))
			},
		},
		{
			// Last: a selector changed changes what the set holds, and the placement's decisions
			// and the namespace following it settle in their own time.
			kind: "ClusterSet",
			write: func(t *testing.T) {
				must(sets.UpdateClusterSet(ctx, connect.NewRequest(&placementv1.UpdateClusterSetRequest{Name: "europe", Selector: &placementv1.ClusterSetSelector{
					Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR, LabelSelector: &placementv1.LabelSelector{MatchLabels: map[string]string{"region": "us", "tier": "gold"}}}})))
			},
			written: []string{"region: us", "tier: gold"},
			want: []string{
				`ClusterSet/europe: spec.selector.labelSelector.matchLabels.region: ` + changedSince + `live "us", manifest "eu"`,
				`ClusterSet/europe: spec.selector.labelSelector.matchLabels.tier: ` + neverApplied + `live "gold", manifest does not set it (apply would remove it)`,
			},
		},
	} {
		if !t.Run(c.kind, func(t *testing.T) { c.check(t, h, run) }) {
			t.FailNow() // the next case needs the fleet as declared
		}
	}
}

// conflictCase is another writer's change, made through the API, to objects of one kind that
// an apply set applied: a field the set applied and one it never applied. The set's next apply
// of the same manifests must refuse, naming each field and the other writer, and change
// nothing (the fields stay the other writer's); its dry run and diff say the same;
// --force-conflicts takes the fields over (the one never applied is removed: apply writes whole
// objects, docs/fleet-as-code.md "Release"), and a rerun is then clean.
type conflictCase struct {
	kind  string
	write func(t *testing.T)
	// written and gone are strings export --kind prints, and no longer prints, once the
	// writer's change is made.
	written, gone []string
	// want are the conflict lines on stderr, from the object's key on (the source before it,
	// file:line: document N:, is left out but for the first document).
	want []string
	// refused: the change is no conflict but one the API cannot make, refused with this
	// message whether forced or not; restore then undoes the writer's change.
	refused string
	restore func(t *testing.T)
	// forced checks more after --force-conflicts.
	forced func(t *testing.T)
}

func (c conflictCase) check(t *testing.T, h *hubEnv, run func(cmd string, extra ...string) result) {
	export := func() string { t.Helper(); return h.run(t, "export", "--kind", c.kind).ok(t).stdout }
	c.write(t)
	written := export()
	for _, w := range c.written {
		if !strings.Contains(written, w) {
			t.Fatalf("the other writer's change is not in the fleet (%q):\n%s", w, written)
		}
	}
	for _, g := range c.gone {
		if strings.Contains(written, g) {
			t.Fatalf("the other writer's change is not in the fleet (%q still there):\n%s", g, written)
		}
	}
	lacks := func(out string, suffix string) []string {
		var missing []string
		for _, w := range c.want {
			if !strings.Contains(out, w+suffix+"\n") {
				missing = append(missing, w+suffix)
			}
		}
		if c.refused != "" && !strings.Contains(out, c.refused) {
			missing = append(missing, c.refused)
		}
		return missing
	}
	for _, extra := range [][]string{nil, {"--dry-run"}, {"--dry-run=server"}} {
		r := run("apply", extra...)
		if missing := lacks(r.stderr, ""); r.code != 1 || len(missing) > 0 || !strings.Contains(r.stderr, "nothing was changed") ||
			strings.Contains(r.stdout, " configured") || strings.Contains(r.stdout, " created") {
			t.Fatalf("apply %v after another writer's change: exit %d, lacks %q\n%s%s", extra, r.code, missing, r.stdout, r.stderr)
		}
	}
	if r := run("diff"); r.code != 2 || len(lacks(r.stderr, "")) > 0 || !strings.Contains(r.stdout, "+++ declared/"+c.kind+"/") {
		t.Fatalf("diff after another writer's change: exit %d, lacks %q\n%s%s", r.code, lacks(r.stderr, ""), r.stdout, r.stderr)
	}
	if got := export(); got != written {
		t.Fatalf("a refused apply changed the other writer's objects:\n%s\nwas:\n%s", got, written)
	}
	r := run("apply", "--force-conflicts")
	if c.refused != "" {
		if r.code != 1 || !strings.Contains(r.stderr, c.refused) || export() != written {
			t.Fatalf("apply --force-conflicts of a change the API cannot make: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		c.restore(t)
	} else {
		if missing := lacks(r.stderr, " (taken over: --force-conflicts)"); r.code != 0 || len(missing) > 0 || !strings.Contains(r.stdout, c.kind+"/") {
			t.Fatalf("apply --force-conflicts: exit %d, lacks %q\n%s%s", r.code, missing, r.stdout, r.stderr)
		}
		if c.forced != nil {
			c.forced(t)
		}
	}
	// The fleet is as declared again (diff reads it back from the API), and the set owns every
	// field: a rerun changes nothing and meets no conflict.
	var d result
	deadline := time.Now().Add(20 * time.Second)
	for d = run("diff"); d.code != 0 && time.Now().Before(deadline); d = run("diff") {
		time.Sleep(100 * time.Millisecond)
	}
	if d.code != 0 {
		t.Fatalf("the fleet is not as declared after --force-conflicts: diff exit %d\n%s%s", d.code, d.stdout, d.stderr)
	}
	if r := run("apply"); r.code != 0 || strings.Contains(r.stdout, " configured") || strings.Contains(r.stdout, " created") || r.stderr != "" {
		t.Fatalf("rerun: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestApplyWithItsRecordLost: the set's record is gone (a CI cache evicted) but the fleet holds
// objects labelled with the set, so the set has applied before. apply and diff refuse rather
// than overwrite whatever was changed by hand since; --force-conflicts takes every field over
// and records it again. A set whose first apply this is (nothing labelled) is not refused.
func TestApplyWithItsRecordLost(t *testing.T) {
	h := startHub(t)
	dir := t.TempDir()
	records := filepath.Join(dir, "records")
	doc := func(kind, meta, spec string) string {
		return "---\napiVersion: fleetstream.io/v1alpha1\nkind: " + kind + "\nmetadata: " + meta + "\nspec: " + spec + "\n"
	}
	fleet := filepath.Join(dir, "fleet.yaml")
	writeFile(t, fleet, doc("Cluster", "{name: eu-1}", "{}")+doc("Project", "{name: team-a}", `{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: "8"}}]}`))
	run := func(cmd, set, path string, extra ...string) result {
		t.Helper()
		args := []string{cmd, "-f", path, "--applyset", set, "--applyset-records", records}
		if cmd == "apply" {
			args = append(args, "--token-dir", filepath.Join(dir, "tokens"))
		}
		return h.run(t, append(args, extra...)...)
	}
	budget := func() string {
		t.Helper()
		out := h.run(t, "export", "--kind", "Project").ok(t).stdout
		for _, v := range []string{"8", "20"} {
			if strings.Contains(out, `cpu: "`+v+`"`) {
				return v
			}
		}
		t.Fatalf("no budget exported:\n%s", out)
		return ""
	}
	run("apply", "fleet", fleet).ok(t)
	h.run(t, "project", "budget", "team-a", "--cluster", "eu-1", "--hard", "cpu=20").ok(t)
	if err := os.Remove(filepath.Join(records, "fleet.json")); err != nil {
		t.Fatal(err)
	}
	wantErr := "apply set fleet has no record of what it applied (" + filepath.Join(records, "fleet.json") + "), yet 2 object(s) in the fleet carry its label applyset.fleetstream.io/part-of=fleet (Cluster/eu-1, Project/team-a)"
	for cmd, code := range map[string]int{"apply": 1, "diff": 2} {
		r := run(cmd, "fleet", fleet)
		if r.code != code || !strings.Contains(r.stderr, wantErr) || !strings.Contains(r.stderr, "--force-conflicts") || strings.Contains(r.stdout, "configured") {
			t.Fatalf("%s without the set's record: exit %d, want %d\n%s%s", cmd, r.code, code, r.stdout, r.stderr)
		}
	}
	if b := budget(); b != "20" {
		t.Fatalf("a refused apply overwrote the hand change: budget %s", b)
	}
	if _, err := os.Stat(filepath.Join(records, "fleet.json")); err == nil {
		t.Fatal("a refused apply wrote a record")
	}
	r := run("apply", "fleet", fleet, "--force-conflicts").ok(t)
	if !strings.Contains(r.stderr, "(every declared field taken over: --force-conflicts)") || !strings.Contains(r.stdout, "Project/team-a configured\n") {
		t.Fatalf("apply --force-conflicts without a record:\n%s%s", r.stdout, r.stderr)
	}
	if b := budget(); b != "8" {
		t.Fatalf("budget after --force-conflicts: %s, want 8", b)
	}
	if r := run("apply", "fleet", fleet); r.code != 0 || r.stderr != "" {
		t.Fatalf("rerun with the record written again: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// A first apply: nothing in the fleet carries the set's label.
	edge := filepath.Join(dir, "edge.yaml")
	writeFile(t, edge, doc("Cluster", "{name: us-1}", "{}"))
	if r := run("apply", "edge", edge); r.code != 0 || !strings.Contains(r.stdout, "Cluster/us-1 created\n") {
		t.Fatalf("first apply of a set: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
