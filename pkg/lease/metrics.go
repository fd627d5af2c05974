package lease

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is gauge fleetstream_lease_leading{lease}: 1 while this process holds a lease and
// runs its work, 0 while it contends or stands by. Every replica that contends reports each of
// its leases, so a lease whose every series is 0 is held by nobody: the one writer it guards
// (a fan-out, a bucket writer, a scheduler) is not running anywhere. The view engines' leases
// have fleetstream_view_leading instead (pkg/view).
type Metrics struct {
	mu      sync.Mutex
	leading *prometheus.GaugeVec
}

// NewMetrics returns the gauge, to be registered by the service's Mount and passed to Run with
// WithMetrics.
func NewMetrics() *Metrics {
	return &Metrics{leading: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetstream_lease_leading",
		Help: "1 while this replica holds the lease and runs the one writer it guards, else 0; every replica that contends reports each of its leases (the view engines' leases: fleetstream_view_leading).",
	}, []string{"lease"})}
}

// Register registers the gauge on reg. Services of one process (fleetd) share one gauge, told
// apart by lease: a second Register adopts the first's.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	err := reg.Register(m.leading)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		g, ok := are.ExistingCollector.(*prometheus.GaugeVec)
		if !ok {
			return fmt.Errorf("register lease gauge: %w", err)
		}
		m.mu.Lock()
		m.leading = g
		m.mu.Unlock()
		return nil
	}
	if err != nil {
		return fmt.Errorf("register lease gauge: %w", err)
	}
	return nil
}

func (m *Metrics) set(lease string, leading bool) {
	if m == nil {
		return
	}
	v := 0.0
	if leading {
		v = 1
	}
	m.mu.Lock()
	g := m.leading
	m.mu.Unlock()
	g.WithLabelValues(lease).Set(v)
}

// WithMetrics reports the lease on m's gauge.
func WithMetrics(m *Metrics) Option { return func(o *options) { o.metrics = m } }
