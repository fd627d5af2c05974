package placement

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func celPredicate(exprs ...string) Predicate {
	return Predicate{RequiredClusterSelector: ClusterSelector{CELSelector: CELSelector{CELExpressions: exprs}}}
}

// TestCELCompile: what the API refuses when a placement is written, and
// the field the scheduler names for it.
func TestCELCompile(t *testing.T) {
	nested := `managedCluster.metadata.labels.all(a, managedCluster.metadata.labels.all(b, managedCluster.metadata.labels.all(c, a + b + c != "")))`
	cases := []struct {
		name    string
		expr    string
		wantErr string // "" = accepted
	}{
		{"label", `managedCluster.metadata.labels["env"] == "prod"`, ""},
		{"claim with exists", `managedCluster.status.clusterClaims.exists(c, c.name == "platform" && c.value == "eks")`, ""},
		{"regex on a label", `managedCluster.metadata.labels["version"].matches('^1\\.(30|31)\\.\\d+$')`, ""},
		{"semver comparison", `semver(managedCluster.status.version.kubernetes, true).isGreaterThan(semver("1.30.0"))`, ""},
		{"scores", `managedCluster.scores("telemetry").filter(s, s.name == "cpuRatio").all(e, e.value > 10)`, ""},
		{"string extension", `managedCluster.metadata.name.startsWith("eu-") && managedCluster.metadata.name.lowerAscii() == managedCluster.metadata.name`, ""},
		{"one loop over labels", `managedCluster.metadata.labels.all(k, k.size() < 64)`, ""},
		{"a loop over a literal inside a loop over labels", `managedCluster.metadata.labels.exists(k, ["env", "tier"].exists(p, k.startsWith(p)))`, ""},
		{"two nested loops over labels exceed the cost limit", `managedCluster.metadata.labels.all(a, managedCluster.metadata.labels.all(b, a != b || a == b))`, "exceeds the limit"},
		{"syntax error", `managedCluster.metadata.labels["env"] ==`, "compilation failed"},
		{"undeclared variable", `invalid.expression`, "undeclared reference"},
		{"unknown function", `managedCluster.metadata.labels["v"].matchessssss('x')`, "undeclared reference"},
		{"not a bool", `managedCluster.metadata.name.size()`, "must evaluate to a bool"},
		{"int, not a bool", `1 + 2`, "must evaluate to a bool"},
		{"three nested loops over labels exceed the cost limit", nested, "exceeds the limit"},
		{"too long", `true && ` + strings.Repeat("true && ", 600) + `true`, "longer than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckCELExpression(c.expr)
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Fatalf("err = %v, want one containing %q", err, c.wantErr)
			}
			if c.wantErr == "" {
				return
			}
			// The scheduler reports the same problem with the field path.
			p := Placement{Predicates: []Predicate{labelPredicate("env", "prod"), celPredicate(`true`, c.expr)}}
			d := run(t, []Cluster{cluster("a")}, nil, nil, p, bound)
			mis, _ := d.Condition(ConditionPlacementMisconfigured)
			const want = "predicates[1].required_cluster_selector.cel_selector.cel_expressions[1]"
			if mis.Status != ConditionTrue || mis.Field != want || !strings.Contains(mis.Message, c.wantErr) {
				t.Fatalf("condition %+v, want Misconfigured naming %s", mis, want)
			}
			if len(d.Clusters) != 0 {
				t.Fatalf("a misconfigured placement selected %v", d.ClusterNames())
			}
		})
	}
}

// TestCELSelect: CEL predicates select as OCM's examples do (its predicate
// and cel tests, and the enhancement's examples), ANDed with the label and
// claim selectors, ORed across predicates.
func TestCELSelect(t *testing.T) {
	clusters := []Cluster{
		cluster("a", lbl("env", "prod"), lbl("region", "us-east-1"), claim(ClaimKubeVersion, "v1.31.2"), claim("cloud", "Amazon")),
		cluster("b", lbl("env", "prod"), lbl("region", "us-west-1"), claim(ClaimKubeVersion, "v1.29.10"), claim("cloud", "Google")),
		cluster("c", lbl("env", "dev"), lbl("version", "1.30.4"), claim(ClaimKubeVersion, "v1.30.0-rc.1"), claim("cloud", "Amazon")),
		cluster("d", res(ResourceMemory, "64Gi", "64Gi"), taint("gpu", "h100", TaintEffectPreferNoSelect, fakeTime)),
	}
	valid := fakeTime.Add(-time.Hour) // expired: scores() ignores valid_until, as OCM's does
	scores := []AddOnScore{
		{AddOnScoreKey: AddOnScoreKey{Cluster: "a", ResourceName: "test-addon", ScoreName: "test-score"}, Score: 90},
		{AddOnScoreKey: AddOnScoreKey{Cluster: "b", ResourceName: "test-addon", ScoreName: "test-score"}, Score: 70},
		{AddOnScoreKey: AddOnScoreKey{Cluster: "c", ResourceName: "test-addon", ScoreName: "test-score"}, Score: 95, ValidUntil: &valid},
	}
	cases := []struct {
		name       string
		predicates []Predicate
		want       []string
	}{
		{"label", []Predicate{celPredicate(`managedCluster.metadata.labels["region"] == "us-east-1"`)}, []string{"a"}},
		{"a missing label is false, not an error", []Predicate{celPredicate(`managedCluster.metadata.labels["env"] != "prod"`)}, []string{"c"}},
		{"has() on a label", []Predicate{celPredicate(`!has(managedCluster.metadata.labels.env)`)}, []string{"d"}},
		{"name", []Predicate{celPredicate(`managedCluster.metadata.name in ["b", "d"]`)}, []string{"b", "d"}},
		{"claim", []Predicate{celPredicate(`managedCluster.status.clusterClaims.exists(c, c.name == "cloud" && c.value == "Amazon")`)}, []string{"a", "c"}},
		{"regex on a label", []Predicate{celPredicate(`managedCluster.metadata.labels["version"].matches('^1\\.(30|31)\\.\\d+$')`)}, []string{"c"}},
		{"kubernetes version, regex", []Predicate{celPredicate(`managedCluster.status.version.kubernetes.matches('^v1\\.(30|31)\\.')`)}, []string{"a", "c"}},
		{"kubernetes version, semver greater", []Predicate{celPredicate(`semver(managedCluster.status.version.kubernetes, true).isGreaterThan(semver("1.30.0"))`)}, []string{"a"}},
		{"semver orders a pre-release before its release", []Predicate{celPredicate(`semver(managedCluster.status.version.kubernetes, true).isLessThan(semver("1.30.0"))`)}, []string{"b", "c"}},
		{"semver parts", []Predicate{celPredicate(`semver(managedCluster.status.version.kubernetes, true).minor() >= 30`)}, []string{"a", "c"}},
		{"claim version through semver", []Predicate{celPredicate(`managedCluster.status.clusterClaims.exists(c, c.name == "kubeversion.fleetstream.io" && isSemver(c.value, true) && semver(c.value, true).compareTo(semver("1.31.0")) >= 0)`)}, []string{"a"}},
		{"scores", []Predicate{celPredicate(`managedCluster.scores("test-addon").filter(s, s.name == 'test-score').all(e, e.value > 80)`)}, []string{"a", "c"}},
		{"scores of a resource the cluster lacks are an error, so false", []Predicate{celPredicate(`managedCluster.scores("other").size() == 0`)}, []string{}},
		{"allocatable", []Predicate{celPredicate(`has(managedCluster.status.allocatable.memory)`)}, []string{"d"}},
		{"allocatable as a quantity string", []Predicate{celPredicate(`managedCluster.status.allocatable.memory == "64Gi"`,
			`managedCluster.status.capacity.exists(r, r == "memory")`)}, []string{"d"}},
		{"taints", []Predicate{celPredicate(`managedCluster.spec.taints.exists(t, t.key == "gpu" && t.effect == "PreferNoSelect")`)}, []string{"d"}},
		{"expressions are ANDed", []Predicate{celPredicate(`managedCluster.metadata.labels["env"] == "prod"`, `managedCluster.scores("test-addon").filter(s, s.name == 'test-score').all(e, e.value > 80)`)}, []string{"a"}},
		{"ANDed with the label and claim selectors", []Predicate{{RequiredClusterSelector: ClusterSelector{
			LabelSelector: matchLabels("env", "prod"), ClaimSelector: claimIn("cloud", "Amazon", "Google"),
			CELSelector: CELSelector{CELExpressions: []string{`managedCluster.status.clusterClaims.exists(c, c.name == "cloud" && c.value == "Amazon")`}}}}},
			[]string{"a"}},
		{"predicates are ORed", []Predicate{celPredicate(`managedCluster.metadata.name == "b"`), labelPredicate("env", "dev")}, []string{"b", "c"}},
		{"no expressions match everything", []Predicate{celPredicate()}, []string{"a", "b", "c", "d"}},
		{"a result that is not a bool is false", []Predicate{celPredicate(`managedCluster.metadata.name`)}, []string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := run(t, clusters, nil, scores, Placement{Predicates: c.predicates}, bound)
			if mis, _ := d.Condition(ConditionPlacementMisconfigured); mis.Status != ConditionFalse {
				t.Fatalf("misconfigured: %+v", mis)
			}
			if got := sortedCopy(d.ClusterNames()); !slices.Equal(got, c.want) {
				t.Fatalf("selected %v, want %v", got, c.want)
			}
		})
	}
}

// TestCELRuntimeCostLimit: a fleet bigger than the estimate assumed is
// stopped by the runtime limit, and the expression is false there.
func TestCELRuntimeCostLimit(t *testing.T) {
	expr := `managedCluster.status.clusterClaims.exists(c, c.value.contains("needle"))`
	if err := CheckCELExpression(expr); err != nil {
		t.Fatalf("refused at compile time: %v", err)
	}
	// 20 MB: contains() then costs about 2,000,000, twice the limit.
	huge := strings.Repeat("x", 20<<20) + "needle"
	d := run(t, []Cluster{cluster("huge", claim("blob", huge)), cluster("small", claim("blob", "a needle"))}, nil, nil,
		Placement{Predicates: []Predicate{celPredicate(expr)}}, bound)
	if got := d.ClusterNames(); !slices.Equal(got, []string{"small"}) {
		t.Fatalf("selected %v, want only small (huge exceeds the runtime cost limit)", got)
	}
}

// TestCELProgramsAreCached: the same expression compiles once.
func TestCELProgramsAreCached(t *testing.T) {
	const e = `managedCluster.metadata.name == "cached-expression-test"`
	a, err := compileCEL(e)
	if err != nil {
		t.Fatal(err)
	}
	b, err := compileCEL(e)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("compiled twice: the program is not cached")
	}
}

func TestParseSemver(t *testing.T) {
	cases := []struct {
		in        string
		normalize bool
		want      string // "" = invalid; else major.minor.patch
	}{
		{"1.2.3", false, "1.2.3"},
		{"v1.2.3", false, ""},
		{"v1.2.3", true, "1.2.3"},
		{"1.2", false, ""},
		{"1.2", true, "1.2.0"},
		{"01.01.01", false, ""},
		{"01.01.01", true, "1.1.1"},
		{"1.30.0-rc.1+build.5", false, "1.30.0"},
		{"1.2.3-01", false, ""},
		{"1.2.x", true, ""},
		{"", true, ""},
	}
	for _, c := range cases {
		v, err := parseSemver(c.in, c.normalize)
		got := ""
		if err == nil {
			got = fmt.Sprintf("%d.%d.%d", v.nums[0], v.nums[1], v.nums[2])
		}
		if got != c.want {
			t.Errorf("parseSemver(%q, %v) = %q (%v), want %q", c.in, c.normalize, got, err, c.want)
		}
	}
	order := []string{"1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.10.0"}
	for i := 1; i < len(order); i++ {
		a, _ := parseSemver(order[i-1], false)
		b, _ := parseSemver(order[i], false)
		if compareSemver(a, b) != -1 || compareSemver(b, a) != 1 {
			t.Errorf("want %s < %s (semver.org's order)", order[i-1], order[i])
		}
	}
}

// TestCELConcurrentFirstUse: goroutines that each make a fleet's first CEL
// evaluations at once decide the same (run with -race).
func TestCELConcurrentFirstUse(t *testing.T) {
	var clusters []Cluster
	for i := range 40 {
		clusters = append(clusters, cluster(fmt.Sprintf("c%02d", i), lbl("n", fmt.Sprint(i%4))))
	}
	f, err := NewFleet(clusters, defaultSets(), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := Placement{Predicates: []Predicate{celPredicate(`managedCluster.metadata.labels["n"] == "1"`)}}
	st := PlacementState{BoundClusterSets: []string{DefaultClusterSet}, Now: fakeTime}
	got := make(chan []string, 8)
	for range 8 {
		go func() {
			d, err := f.Schedule(context.Background(), &p, st)
			if err != nil {
				got <- nil
				return
			}
			got <- d.ClusterNames()
		}()
	}
	for range 8 {
		if names := <-got; len(names) != 10 {
			t.Errorf("decided %v, want the 10 clusters with n=1", names)
		}
	}
}
