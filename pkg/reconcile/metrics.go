package reconcile

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// metrics are one queue's: client-go's workqueue metrics (the names component-base gives
// them, prefixed fleet_), labelled with the queue's name as a constant, so the queues of every
// service of a process (fleetd) register side by side on one registry. A controller keeps
// them across its runs (each run is a new queue).
type metrics struct {
	depth                   prometheus.Gauge
	adds                    prometheus.Counter
	latency                 prometheus.Histogram
	workDuration            prometheus.Histogram
	unfinishedWorkSeconds   prometheus.Gauge
	longestRunningProcessor prometheus.Gauge
	retries                 prometheus.Counter
}

var _ workqueue.MetricsProvider = (*metrics)(nil)

func newMetrics(name string) *metrics {
	labels := prometheus.Labels{"name": name}
	buckets := prometheus.ExponentialBuckets(10e-9, 10, 12) // 10 ns to 1000 s, as component-base
	return &metrics{
		depth: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleet_workqueue_depth", ConstLabels: labels,
			Help: "Keys waiting in a hub loop's queue."}),
		adds: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleet_workqueue_adds_total", ConstLabels: labels,
			Help: "Keys queued by a hub loop."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fleet_workqueue_queue_duration_seconds", ConstLabels: labels,
			Help: "How long a key waits in a hub loop's queue before it is reconciled.", Buckets: buckets}),
		workDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fleet_workqueue_work_duration_seconds", ConstLabels: labels,
			Help: "How long reconciling a key takes.", Buckets: buckets}),
		unfinishedWorkSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleet_workqueue_unfinished_work_seconds", ConstLabels: labels,
			Help: "Seconds of work in progress not yet observed by work_duration; large values mean a stuck reconcile."}),
		longestRunningProcessor: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleet_workqueue_longest_running_processor_seconds", ConstLabels: labels,
			Help: "How long the longest running reconcile of a hub loop has been running."}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleet_workqueue_retries_total", ConstLabels: labels,
			Help: "Failed reconciles queued again with their key's backoff; a reconciler's AddAfter for a later moment is not one."}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.depth, m.adds, m.latency, m.workDuration, m.unfinishedWorkSeconds, m.longestRunningProcessor, m.retries}
}

// Collectors are the controller's queue metrics, for the process's registry.
func (c *Controller) Collectors() []prometheus.Collector { return c.metrics.collectors() }

func (m *metrics) NewDepthMetric(string) workqueue.GaugeMetric            { return m.depth }
func (m *metrics) NewAddsMetric(string) workqueue.CounterMetric           { return m.adds }
func (m *metrics) NewLatencyMetric(string) workqueue.HistogramMetric      { return m.latency }
func (m *metrics) NewWorkDurationMetric(string) workqueue.HistogramMetric { return m.workDuration }
func (m *metrics) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return m.unfinishedWorkSeconds
}
func (m *metrics) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return m.longestRunningProcessor
}

// NewRetriesMetric gives client-go a counter that counts nothing: client-go counts every
// delayed add as a retry, an AddAfter for a moment a key is due (liveness, a toleration) as
// much as a failure's backoff. processNext counts the failures itself (retries).
func (m *metrics) NewRetriesMetric(string) workqueue.CounterMetric { return noCount{} }

type noCount struct{}

func (noCount) Inc() {}
