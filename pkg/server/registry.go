package server

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Registry is the process's metric registry. It remembers the collectors registered on it so
// the metric catalogue (docs/metrics.md) can describe every metric, including a vector that has
// no series yet (a Gather shows only metrics with samples, and a Desc does not carry a type).
type Registry struct {
	*prometheus.Registry

	mu         sync.Mutex
	collectors []prometheus.Collector
}

func newRegistry() *Registry { return &Registry{Registry: prometheus.NewRegistry()} }

// Register registers c and remembers it.
func (r *Registry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.collectors = append(r.collectors, c)
	return nil
}

// MustRegister registers every collector and panics on the first that fails, as
// prometheus.Registry's does.
func (r *Registry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Collectors are the collectors registered so far, in order.
func (r *Registry) Collectors() []prometheus.Collector {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]prometheus.Collector(nil), r.collectors...)
}
