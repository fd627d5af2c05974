// Package monitoring checks the dashboards and alert rules of deploy/monitoring against the
// metric catalogue (docs/metrics.md): a panel or an alert on a metric the code does not serve
// shows nothing and never fires, and nobody notices until the day it was needed.
package monitoring

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

// Catalogue is the metrics docs/metrics.md lists: name → type (counter, gauge, histogram,
// summary).
type Catalogue map[string]string

// standard are the prefixes of client_golang's own collectors, which every process serves and
// the catalogue names in one line rather than listing (their set follows the Go release).
var standard = []string{"go_", "process_", "promhttp_"}

var catalogueRow = regexp.MustCompile("^\\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \\| ([a-z]+) \\|")

// ReadCatalogue reads the table of docs/metrics.md.
func ReadCatalogue(path string) (Catalogue, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cat := Catalogue{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := catalogueRow.FindStringSubmatch(sc.Text()); m != nil {
			cat[m[1]] = m[2]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(cat) == 0 {
		return nil, fmt.Errorf("%s: no metric rows (| `name` | type | ...): has its format changed?", path)
	}
	return cat, nil
}

// Known reports whether name is served: a catalogue metric, one of a histogram's (or
// summary's) _bucket/_sum/_count series, a standard collector's metric, or a name a recording
// rule of ours defines (recorded).
func (c Catalogue) Known(name string, recorded map[string]bool) bool {
	if _, ok := c[name]; ok || recorded[name] {
		return true
	}
	for _, p := range standard {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		switch c[base] {
		case "histogram":
			return true
		case "summary":
			return suffix != "_bucket"
		}
	}
	return false
}

// MetricNames parses a PromQL expression and returns the metric names its selectors read. A
// selector that picks metrics by anything but an exact name cannot be checked, and is an error.
func MetricNames(expr string) ([]string, error) {
	// The default options: the functions a stock Prometheus accepts, no experimental ones.
	node, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	var errs []error
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name != labels.MetricName {
				continue
			}
			if m.Type != labels.MatchEqual {
				errs = append(errs, fmt.Errorf("%s: selects metrics by %s on the name, not one name", vs, m.Type))
			}
			name = m.Value
		}
		if name != "" {
			names = append(names, name)
		}
		return nil
	})
	return names, errors.Join(errs...)
}

// grafanaVars stand in for Grafana's interval variables, which are durations in a query.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// labelValues is a Grafana variable query over the label values of a metric (or of a selector).
var labelValues = regexp.MustCompile(`^\s*label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)

// checkExpr checks one expression; where says where it is, for the error.
func (c Catalogue) checkExpr(where, expr string, recorded map[string]bool) []string {
	names, err := MetricNames(expr)
	if err != nil {
		return []string{fmt.Sprintf("%s: %v\n    %s", where, err, expr)}
	}
	if len(names) == 0 {
		return []string{fmt.Sprintf("%s: reads no metric: %s", where, expr)}
	}
	var problems []string
	for _, n := range names {
		if !c.Known(n, recorded) {
			problems = append(problems, fmt.Sprintf("%s: metric %s is not in docs/metrics.md", where, n))
		}
	}
	return problems
}

// RuleFile is a Prometheus rule file (the parts the checks read).
type RuleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []Rule `yaml:"rules"`
	} `yaml:"groups"`
}

// Rule is a recording or alerting rule.
type Rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// ReadRules reads a rule file.
func ReadRules(path string) (*RuleFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rf RuleFile
	if err := yaml.Unmarshal(data, &rf); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &rf, nil
}

// Recorded are the names the file's recording rules define.
func (rf *RuleFile) Recorded() map[string]bool {
	out := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out[r.Record] = true
			}
		}
	}
	return out
}

// CheckRules checks every rule's expression; alerts must say their severity and link their
// runbook, a section of the operations guide whose anchors are given.
func (c Catalogue) CheckRules(rf *RuleFile, runbookPrefix string, anchors map[string]bool) []string {
	recorded := rf.Recorded()
	var problems []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			where := "rule " + r.Record + r.Alert
			problems = append(problems, c.checkExpr(where, r.Expr, recorded)...)
			if r.Alert == "" {
				continue
			}
			if r.Labels["severity"] == "" {
				problems = append(problems, where+": no severity label")
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookPrefix+"#")
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s: runbook_url %q is not a section of %s", where, r.Annotations["runbook_url"], runbookPrefix))
			case !anchors[anchor]:
				problems = append(problems, fmt.Sprintf("%s: runbook section #%s is not a heading of docs/operations.md", where, anchor))
			}
		}
	}
	return problems
}

// CheckDashboard checks a Grafana dashboard (JSON): it parses, has a uid and a title, every
// panel has a title, and every query (panel targets, template variables) reads only
// catalogued metrics. It returns the uid.
func (c Catalogue) CheckDashboard(name string, data []byte, recorded map[string]bool) (string, []string) {
	var d map[string]any
	if err := json.Unmarshal(data, &d); err != nil {
		return "", []string{fmt.Sprintf("%s: %v", name, err)}
	}
	var problems []string
	uid, _ := d["uid"].(string)
	if uid == "" {
		problems = append(problems, name+": no uid")
	}
	if t, _ := d["title"].(string); t == "" {
		problems = append(problems, name+": no title")
	}
	exprs := 0
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if _, isPanel := v["gridPos"]; isPanel {
				if t, _ := v["title"].(string); t == "" {
					problems = append(problems, fmt.Sprintf("%s: panel %s has no title", name, path))
				}
			}
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				s, isString := v[k].(string)
				switch {
				case k == "expr" && isString:
					exprs++
					problems = append(problems, c.checkExpr(name+" "+path, grafanaVars.Replace(s), recorded)...)
				case k == "query" && isString && strings.HasPrefix(path, ".templating") && (v["type"] == nil || v["type"] == "query"):
					// A query variable's query (a datasource or custom variable's "query" is not PromQL).
					q := s
					if m := labelValues.FindStringSubmatch(s); m != nil {
						q = m[1]
					}
					exprs++
					problems = append(problems, c.checkExpr(name+" "+path+" (variable)", grafanaVars.Replace(q), recorded)...)
				default:
					walk(path+"."+k, v[k])
				}
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		}
	}
	walk("", d)
	if exprs == 0 {
		problems = append(problems, name+": no query")
	}
	return uid, problems
}

var headingRE = regexp.MustCompile(`^#{1,6}\s+(.+?)\s*$`)

// Anchors are the anchors GitHub gives the headings of a Markdown file: lower case, spaces as
// hyphens, punctuation other than - and _ dropped.
func Anchors(path string) (map[string]bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		m := headingRE.FindStringSubmatch(line)
		if inCode || m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out, nil
}
