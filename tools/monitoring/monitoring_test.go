package monitoring

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// root is the repository root, from this package's directory.
const root = "../.."

// runbookPrefix is where every alert's runbook_url points: a section of docs/operations.md.
const runbookPrefix = "https://github.com/fleetstream/fleetstream/blob/main/docs/operations.md"

const rulesFile = "deploy/monitoring/rules/fleetstream.rules.yaml"

// chartRules is the hub chart's view of the rules (a symlink to rulesFile: .Files.Get reads only
// inside the chart), which its PrometheusRule renders.
const chartRules = "deploy/helm/fleetstream/files/fleetstream.rules.yaml"

func catalogue(t *testing.T) Catalogue {
	t.Helper()
	cat, err := ReadCatalogue(filepath.Join(root, "docs/metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

// TestRulesUseCataloguedMetrics: every rule reads only metrics fleetd and the gateway serve,
// and every alert has a severity and a runbook section in docs/operations.md.
func TestRulesUseCataloguedMetrics(t *testing.T) {
	cat := catalogue(t)
	rf, err := ReadRules(filepath.Join(root, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	anchors, err := Anchors(filepath.Join(root, "docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts++
			}
		}
	}
	if alerts == 0 {
		t.Fatalf("%s holds no alert", rulesFile)
	}
	for _, p := range cat.CheckRules(rf, runbookPrefix, anchors) {
		t.Error(p)
	}
}

// TestDashboardsUseCataloguedMetrics: every dashboard parses, has a unique uid, and every
// query reads only catalogued metrics (or what the rules record).
func TestDashboardsUseCataloguedMetrics(t *testing.T) {
	cat := catalogue(t)
	rf, err := ReadRules(filepath.Join(root, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy/monitoring/dashboards/*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("%d dashboards, want at least fleet overview, propagation SLO, views and NATS", len(files))
	}
	uids := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		uid, problems := cat.CheckDashboard(filepath.Base(f), data, rf.Recorded())
		for _, p := range problems {
			t.Error(p)
		}
		if other, dup := uids[uid]; dup && uid != "" {
			t.Errorf("%s and %s share uid %s", other, filepath.Base(f), uid)
		}
		uids[uid] = filepath.Base(f)
	}
}

// TestChartRulesAreTheRules: the chart installs the same rules promtool tests, not a copy that
// drifted.
func TestChartRulesAreTheRules(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(root, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, chartRules))
	if err != nil {
		t.Fatalf("the chart's rules: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s: it must be a symlink to it", chartRules, rulesFile)
	}
}

// TestCheckerRefuses shows the checks fail on what they exist to catch, so their passing
// above means something.
func TestCheckerRefuses(t *testing.T) {
	cat := Catalogue{
		"fleetstream_propagation_duration_seconds": "histogram",
		"fleetstream_rpc_requests_total":           "counter",
		"fleet_xds_streams":                        "gauge",
	}
	recorded := map[string]bool{"fleetstream:propagation_slow:ratio_rate5m": true}
	for _, tc := range []struct {
		expr string
		want string // "" = accepted
	}{
		{`sum by (kind) (rate(fleetstream_propagation_duration_seconds_bucket{le="2"}[5m]))`, ""},
		{`histogram_quantile(0.99, sum by (le) (rate(fleetstream_propagation_duration_seconds_bucket[5m])))`, ""},
		{`rate(fleetstream_propagation_duration_seconds_sum[5m]) / rate(fleetstream_propagation_duration_seconds_count[5m])`, ""},
		{`fleetstream:propagation_slow:ratio_rate5m > 0.1`, ""},
		{`rate(process_cpu_seconds_total[5m])`, ""},
		{`{__name__="fleet_xds_streams"}`, ""},
		{`rate(fleetstream_rpc_requests_total[5m]) / rate(fleetstream_rpc_request_total[5m])`, "fleetstream_rpc_request_total is not in docs/metrics.md"},
		{`fleet_xds_streams_bucket`, "fleet_xds_streams_bucket is not in docs/metrics.md"},
		{`fleetstream:propagation_slow:ratio_rate6h`, "fleetstream:propagation_slow:ratio_rate6h is not in"},
		{`{__name__=~"fleet_.*"}`, "not one name"},
		{`sum(rate(fleet_xds_streams[5m])`, "unclosed"},
		{`vector(1)`, "reads no metric"},
	} {
		got := strings.Join(cat.checkExpr("test", tc.expr, recorded), "\n")
		switch {
		case tc.want == "" && got != "":
			t.Errorf("%s: refused: %s", tc.expr, got)
		case tc.want != "" && !strings.Contains(strings.ToLower(got), strings.ToLower(tc.want)):
			t.Errorf("%s: got %q, want an error containing %q", tc.expr, got, tc.want)
		}
	}

	dashboard := `{"uid": "x", "title": "X", "templating": {"list": [
		{"type": "datasource", "name": "datasource", "query": "prometheus"},
		{"type": "query", "name": "view", "query": {"query": "label_values(fleetstream_view_nope, view)"}}]},
	  "panels": [{"title": "ok", "gridPos": {}, "targets": [{"expr": "rate(fleetstream_rpc_requests_total[$__rate_interval])"}]},
	             {"gridPos": {}, "targets": [{"expr": "fleetstream_gone"}]}]}`
	_, problems := cat.CheckDashboard("d.json", []byte(dashboard), nil)
	got := strings.Join(problems, "\n")
	for _, want := range []string{"fleetstream_view_nope is not in", "fleetstream_gone is not in", "has no title"} {
		if !strings.Contains(got, want) {
			t.Errorf("dashboard problems %q do not say %q", got, want)
		}
	}
	if strings.Contains(got, "prometheus") || strings.Contains(got, "rpc_requests") {
		t.Errorf("dashboard problems %q name a datasource variable or a good query", got)
	}

	rules := &RuleFile{}
	rules.Groups = append(rules.Groups, struct {
		Name  string `yaml:"name"`
		Rules []Rule `yaml:"rules"`
	}{Name: "g", Rules: []Rule{
		{Alert: "NoRunbook", Expr: "fleet_xds_streams > 1", Labels: map[string]string{"severity": "warning"}},
		{Alert: "MissingSection", Expr: "fleet_xds_streams > 1", Labels: map[string]string{"severity": "warning"},
			Annotations: map[string]string{"runbook_url": runbookPrefix + "#nosuchsection"}},
		{Alert: "NoSeverity", Expr: "fleet_xds_streams > 1", Annotations: map[string]string{"runbook_url": runbookPrefix + "#present"}},
	}})
	got = strings.Join(cat.CheckRules(rules, runbookPrefix, map[string]bool{"present": true}), "\n")
	for _, want := range []string{"NoRunbook: runbook_url", "#nosuchsection is not a heading", "NoSeverity: no severity"} {
		if !strings.Contains(got, want) {
			t.Errorf("rule problems %q do not say %q", got, want)
		}
	}
}
