// Package metriccatalog describes the metrics registered on a process's registry and renders
// the catalogue docs/metrics.md from them, so the catalogue is what the code registers.
package metriccatalog

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metric is one metric name as the catalogue lists it.
type Metric struct {
	Name string
	Type string // counter, gauge, histogram, summary
	Help string
	// Labels are the variable labels, in their order.
	Labels []string
	// ConstLabels maps a constant label to the values it takes across registrations (a hub
	// loop's queue metrics are registered once per loop, with the loop's name).
	ConstLabels map[string][]string
}

// Standard are the prefixes of the collectors every process has (client_golang's Go, process
// and promhttp collectors): the catalogue names them in one line, since their set follows the
// Go release, not this code.
var Standard = []string{"go_", "process_", "promhttp_"}

// Prefixes are the prefixes this code's metrics take. Both are in use (fleet_ for the hub
// loops, agent reports and xDS; fleetstream_ for the RPCs, the gateway, the RBAC fan-out and
// the SLOs) and users alert on both, so neither is renamed; a new metric takes fleetstream_.
var Prefixes = []string{"fleet_", "fleetstream_"}

// IsStandard reports whether name is one of the standard collectors' metrics.
func IsStandard(name string) bool {
	for _, p := range Standard {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

var (
	descRE  = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), unit: "(?:[^"\\]|\\.)*", constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)
	constRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)=("(?:[^"\\]|\\.)*")`)
)

type desc struct {
	name, help  string
	constLabels map[string]string
	labels      []string
}

// parseDesc reads a Desc's String: client_golang gives no accessors for a Desc's parts.
func parseDesc(d *prometheus.Desc) (desc, error) {
	m := descRE.FindStringSubmatch(d.String())
	if m == nil {
		return desc{}, fmt.Errorf("metric descriptor %s: not in the form this parser reads (client_golang changed?)", d)
	}
	var out desc
	if _, err := fmt.Sscanf(m[1], "%q", &out.name); err != nil {
		return desc{}, fmt.Errorf("metric descriptor %s: name: %w", d, err)
	}
	if _, err := fmt.Sscanf(m[2], "%q", &out.help); err != nil {
		return desc{}, fmt.Errorf("metric descriptor %s: help: %w", d, err)
	}
	out.constLabels = map[string]string{}
	for _, lp := range constRE.FindAllStringSubmatch(m[3], -1) {
		var v string
		if _, err := fmt.Sscanf(lp[2], "%q", &v); err != nil {
			return desc{}, fmt.Errorf("metric descriptor %s: label %s: %w", d, lp[1], err)
		}
		out.constLabels[lp[1]] = v
	}
	if m[4] != "" {
		for _, l := range strings.Split(m[4], ",") {
			out.labels = append(out.labels, strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"))
		}
	}
	return out, nil
}

// Typed is a custom collector that says the type of its metrics, which it cannot say by
// collecting while it has no series (a gauge computed at scrape with nothing to report).
type Typed interface {
	MetricType() string
}

// vecType is the type of a vector's metrics, which a vector with no series yet cannot say by
// collecting.
func vecType(c prometheus.Collector) string {
	switch c := c.(type) {
	case Typed:
		return c.MetricType()
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	}
	return ""
}

func metricType(m prometheus.Metric) (string, error) {
	var pb dto.Metric
	if err := m.Write(&pb); err != nil {
		return "", fmt.Errorf("metric %s: %w", m.Desc(), err)
	}
	switch {
	case pb.Counter != nil:
		return "counter", nil
	case pb.Gauge != nil:
		return "gauge", nil
	case pb.Histogram != nil:
		return "histogram", nil
	case pb.Summary != nil:
		return "summary", nil
	}
	return "untyped", nil
}

// Describe lists the metrics of collectors, one per name, sorted by name, leaving out the
// standard collectors' metrics. A name registered twice with different help, type or labels is
// an error: the catalogue could not say which it is.
func Describe(collectors []prometheus.Collector) ([]Metric, error) {
	byName := map[string]*Metric{}
	for _, c := range collectors {
		types := map[string]string{}
		metrics := make(chan prometheus.Metric)
		go func() { c.Collect(metrics); close(metrics) }()
		var werr error
		for m := range metrics {
			d, err := parseDesc(m.Desc())
			if err == nil {
				var t string
				if t, err = metricType(m); err == nil {
					types[d.name] = t
				}
			}
			if err != nil && werr == nil {
				werr = err
			}
		}
		if werr != nil {
			return nil, werr
		}
		descs := make(chan *prometheus.Desc)
		go func() { c.Describe(descs); close(descs) }()
		var derr error
		for pd := range descs {
			if derr != nil {
				continue
			}
			d, err := parseDesc(pd)
			if err != nil {
				derr = err
				continue
			}
			if IsStandard(d.name) {
				continue
			}
			t := types[d.name]
			if t == "" {
				t = vecType(c)
			}
			if t == "" {
				derr = fmt.Errorf("metric %s: no type: neither a sample nor a known vector type", d.name)
				continue
			}
			m := byName[d.name]
			if m == nil {
				m = &Metric{Name: d.name, Type: t, Help: d.help, Labels: d.labels, ConstLabels: map[string][]string{}}
				byName[d.name] = m
			} else if m.Type != t || m.Help != d.help || !slices.Equal(m.Labels, d.labels) {
				derr = fmt.Errorf("metric %s registered twice, differently (%s %q %v and %s %q %v)", d.name, m.Type, m.Help, m.Labels, t, d.help, d.labels)
				continue
			}
			for k, v := range d.constLabels {
				if !slices.Contains(m.ConstLabels[k], v) {
					m.ConstLabels[k] = append(m.ConstLabels[k], v)
				}
			}
		}
		if derr != nil {
			return nil, derr
		}
	}
	out := make([]Metric, 0, len(byName))
	for _, m := range byName {
		for _, vs := range m.ConstLabels {
			sort.Strings(vs)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Check is the policy every metric of this code keeps: one of Prefixes, and help text.
func Check(ms []Metric) error {
	var errs []string
	for _, m := range ms {
		if !slices.ContainsFunc(Prefixes, func(p string) bool { return strings.HasPrefix(m.Name, p) }) {
			errs = append(errs, fmt.Sprintf("%s: the name takes one of the prefixes %v", m.Name, Prefixes))
		}
		if strings.TrimSpace(m.Help) == "" {
			errs = append(errs, fmt.Sprintf("%s: no help text", m.Name))
		}
	}
	if errs != nil {
		return fmt.Errorf("metric policy:\n  %s", strings.Join(errs, "\n  "))
	}
	return nil
}

// Render writes the catalogue as Markdown.
func Render(ms []Metric) []byte {
	var b bytes.Buffer
	b.WriteString(`# Metric catalogue

<!-- Generated by TestMetricCatalogue (services/fleetd/fleetd) from the collectors fleetd and the
gateway register; do not edit. Regenerate with ` + "`make generate`" + `; ` + "`make lint`" + ` and the test fail while it is stale. -->

Every metric the hub serves on ` + "`/metrics`" + `: fleetd (cluster-import, namespace-binding with placement,
rbac-sync, endpoint-collector, the xDS server) and the gateway. Each service's own binary registers
the subset its ` + "`Mount`" + ` registers. The cluster agent serves no metrics. Every process also serves the
standard ` + "`go_*`" + `, ` + "`process_*`" + ` and ` + "`promhttp_*`" + ` metrics of client_golang, not listed here.

Names take ` + "`fleet_`" + ` or ` + "`fleetstream_`" + ` (both in use, and alerted on, so neither is renamed; a new
metric takes ` + "`fleetstream_`" + `). Labels never carry user, namespace or address values; a constant
label's values are listed with it.

| metric | type | labels | help |
|---|---|---|---|
`)
	for _, m := range ms {
		var labels []string
		for _, l := range m.Labels {
			labels = append(labels, "`"+l+"`")
		}
		consts := make([]string, 0, len(m.ConstLabels))
		for k := range m.ConstLabels {
			consts = append(consts, k)
		}
		sort.Strings(consts)
		for _, k := range consts {
			vs := make([]string, len(m.ConstLabels[k]))
			for i, v := range m.ConstLabels[k] {
				vs[i] = "`" + v + "`"
			}
			labels = append(labels, "`"+k+"` (constant: "+strings.Join(vs, ", ")+")")
		}
		help := strings.ReplaceAll(strings.ReplaceAll(m.Help, "|", `\|`), "\n", " ")
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.Name, m.Type, strings.Join(labels, ", "), help)
	}
	return b.Bytes()
}
