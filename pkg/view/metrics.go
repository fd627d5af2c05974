package view

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics reports every registered engine's progress, read from the engines at each scrape so
// a stalled engine shows as stalled rather than as its last update. The services of one process
// (fleetd) share one: a Set registering after another adds its engines to the first's.
type metrics struct {
	leading, applied, pending *prometheus.GaugeVec

	mu      sync.Mutex
	engines []*Engine
}

func newMetrics() *metrics {
	return &metrics{
		leading: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetstream_view_leading",
			Help: "1 while this replica holds the view's lease (view.<view>) and writes the view, else 0: every replica of its service reports each of its views."}, []string{"view"}),
		applied: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetstream_view_applied_sequence",
			Help: "Stream sequence of the last event applied to the view: by this replica when it leads, by the leader (its checkpoint) when it follows."}, []string{"view"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetstream_view_pending_events",
			Help: "Events of the view's stream after the last one its leader applied, as of that one's delivery (0 in a replica that does not lead)."}, []string{"view"}),
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.leading.Describe(ch)
	m.applied.Describe(ch)
	m.pending.Describe(ch)
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	for _, e := range m.engines {
		e.mu.Lock()
		leading, applied := e.leading, e.applied
		e.mu.Unlock()
		var lead, pending float64
		if leading {
			lead, pending = 1, float64(e.pending.Load())
		}
		m.leading.WithLabelValues(e.p.Name).Set(lead)
		m.applied.WithLabelValues(e.p.Name).Set(float64(applied))
		m.pending.WithLabelValues(e.p.Name).Set(pending)
	}
	m.mu.Unlock()
	m.leading.Collect(ch)
	m.applied.Collect(ch)
	m.pending.Collect(ch)
}

// Register registers the metrics of the set's views on reg (fleetstream_view_leading,
// fleetstream_view_applied_sequence, fleetstream_view_pending_events), for the service's Mount.
func (s *Set) Register(reg prometheus.Registerer) error {
	m := newMetrics()
	err := reg.Register(m)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		existing, ok := are.ExistingCollector.(*metrics)
		if !ok {
			return fmt.Errorf("register view metrics: %w", err)
		}
		m, err = existing, nil
	}
	if err != nil {
		return fmt.Errorf("register view metrics: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, mb := range s.members {
		m.engines = append(m.engines, mb.engine)
	}
	return nil
}
