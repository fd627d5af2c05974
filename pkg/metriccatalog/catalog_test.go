package metriccatalog

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// A vector with no series still has its type and labels in the catalogue, a constant label's
// values merge across registrations, and the standard collectors are left out.
func TestDescribe(t *testing.T) {
	vec := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetstream_x_seconds", Help: "X | time."}, []string{"kind"})
	q := func(name string) prometheus.Collector {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleet_q_depth", Help: "Depth.", ConstLabels: prometheus.Labels{"name": name}})
	}
	ms, err := Describe([]prometheus.Collector{vec, q("b"), q("a"), collectors.NewGoCollector()})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("metrics %+v, want 2", ms)
	}
	if m := ms[1]; m.Name != "fleetstream_x_seconds" || m.Type != "histogram" || strings.Join(m.Labels, ",") != "kind" {
		t.Errorf("vector: %+v", m)
	}
	if m := ms[0]; m.Type != "gauge" || strings.Join(m.ConstLabels["name"], ",") != "a,b" {
		t.Errorf("queue gauge: %+v", m)
	}
	doc := string(Render(ms))
	for _, want := range []string{"| `fleetstream_x_seconds` | histogram | `kind` | X \\| time. |", "`name` (constant: `a`, `b`)"} {
		if !strings.Contains(doc, want) {
			t.Errorf("catalogue lacks %q:\n%s", want, doc)
		}
	}
}

func TestDescribeRefusesOneNameTwoWays(t *testing.T) {
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "fleet_a_total", Help: "A.", ConstLabels: prometheus.Labels{"name": "1"}})
	b := prometheus.NewCounter(prometheus.CounterOpts{Name: "fleet_a_total", Help: "Other.", ConstLabels: prometheus.Labels{"name": "2"}})
	if _, err := Describe([]prometheus.Collector{a, b}); err == nil {
		t.Fatal("one name with two help texts described")
	}
}

func TestCheck(t *testing.T) {
	ok := []Metric{{Name: "fleet_a_total", Help: "A."}, {Name: "fleetstream_b", Help: "B."}}
	if err := Check(ok); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Metric{{Name: "rpc_total", Help: "A."}, {Name: "fleetstream_b", Help: " "}} {
		if err := Check([]Metric{bad}); err == nil {
			t.Errorf("%+v passed the policy", bad)
		}
	}
}

// scrapeGauge is a custom collector computing its gauge at scrape, with nothing to report yet.
type scrapeGauge struct{ desc *prometheus.Desc }

func (g scrapeGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }
func (g scrapeGauge) Collect(chan<- prometheus.Metric)    {}

type typedGauge struct{ scrapeGauge }

func (typedGauge) MetricType() string { return "gauge" }

// A custom collector with no series says its type through MetricType; without it, Describe
// cannot tell the type and says so rather than guess.
func TestDescribeTakesACustomCollectorsType(t *testing.T) {
	desc := prometheus.NewDesc("fleetstream_y_seconds", "Y.", []string{"cluster"}, nil)
	ms, err := Describe([]prometheus.Collector{typedGauge{scrapeGauge{desc: desc}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 || ms[0].Type != "gauge" || strings.Join(ms[0].Labels, ",") != "cluster" {
		t.Fatalf("metrics %+v, want the gauge fleetstream_y_seconds{cluster}", ms)
	}
	if _, err := Describe([]prometheus.Collector{scrapeGauge{desc: desc}}); err == nil || !strings.Contains(err.Error(), "no type") {
		t.Fatalf("an untyped collector without series: %v, want no type", err)
	}
}
