// Package slo measures the promises Fleetstream makes to its users where they are kept.
package slo

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
)

// PropagationBuckets fit the propagation goals (a grant applied on every cluster within 2 s at
// p99): fine around the goal, up to the 30 s past which a change is plainly stuck.
var PropagationBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30}

// maxPending bounds the desired keys awaiting an applied status: a hub whose agents are all
// away must not grow without end. Past it new writes go unmeasured (lost clusters have their
// own signals); a change already pending still is.
const maxPending = 1 << 17

// Propagation measures the time from a change to the agent's applied status for the desired
// object it produced, per kind of change. The writer of a desired bucket calls Written for each
// object it writes; the reader of the applied bucket calls Reported for each status. Only a
// writer measures, so replicas following the leader observe nothing.
type Propagation struct {
	hist *prometheus.HistogramVec
	now  func() time.Time

	mu      sync.Mutex
	pending map[string]pending
}

type pending struct {
	rev   uint64
	kind  string
	since time.Time
}

// NewPropagation builds the tracker and its histogram fleetstream_propagation_duration_seconds.
func NewPropagation() *Propagation {
	return &Propagation{
		hist: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleetstream_propagation_duration_seconds",
			Help: "Time from a change (its view entry, a projection's lag after its event) until the hub reads the agent's applied status " +
				"for the desired object it produced, by kind of change: grant, revoke, role_template (a template's rules), bind, unbind, quota, placement (a namespace put or removed as its placement decides).",
			Buckets: PropagationBuckets,
		}, []string{"kind"}),
		now:     time.Now,
		pending: map[string]pending{},
	}
}

// Register registers the histogram and the oldest-unapplied gauge on reg, for the service's
// Mount. Services of one process (fleetd) share one histogram, told apart by kind: a second
// Register uses the first's; the gauge reads every registered tracker.
func (p *Propagation) Register(reg prometheus.Registerer) error {
	if err := p.registerHist(reg); err != nil {
		return err
	}
	u := &unapplied{}
	err := reg.Register(u)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		existing, ok := are.ExistingCollector.(*unapplied)
		if !ok {
			return fmt.Errorf("register oldest-unapplied gauge: %w", err)
		}
		u, err = existing, nil
	}
	if err != nil {
		return fmt.Errorf("register oldest-unapplied gauge: %w", err)
	}
	u.mu.Lock()
	u.trackers = append(u.trackers, p)
	u.mu.Unlock()
	return nil
}

func (p *Propagation) registerHist(reg prometheus.Registerer) error {
	err := reg.Register(p.hist)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		h, ok := are.ExistingCollector.(*prometheus.HistogramVec)
		if !ok {
			return fmt.Errorf("register propagation histogram: %w", err)
		}
		p.mu.Lock()
		p.hist = h
		p.mu.Unlock()
		return nil
	}
	if err != nil {
		return fmt.Errorf("register propagation histogram: %w", err)
	}
	return nil
}

// Written records that desired key (relative to its bucket) was written at revision rev for a
// change of kind made at since. A key written again before it is applied keeps the earlier
// since: the first change is only kept once the agent applies the later object.
func (p *Propagation) Written(key string, rev uint64, kind string, since time.Time) {
	if since.IsZero() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	prev, ok := p.pending[key]
	if !ok && len(p.pending) >= maxPending {
		return
	}
	if ok && prev.since.Before(since) {
		since = prev.since
	}
	p.pending[key] = pending{rev: rev, kind: kind, since: since}
}

// Reclassify sets the kind of key's pending change, if it has one: for a writer that learns
// what a change was only after writing it (a cache that lags the write's).
func (p *Propagation) Reclassify(key, kind string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pe, ok := p.pending[key]; ok {
		pe.kind = kind
		p.pending[key] = pe
	}
}

// Forget drops key: it was deleted with no agent left to apply it.
func (p *Propagation) Forget(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pending, key)
}

// Reported takes an applied status for desired key: APPLIED at the pending revision or a later
// one is one observation. A failure, or a status about an earlier revision, keeps it pending.
func (p *Propagation) Reported(key string, st *desiredv1.AppliedStatus) {
	if st.GetPhase() != desiredv1.Phase_PHASE_APPLIED {
		return
	}
	p.mu.Lock()
	pe, ok := p.pending[key]
	if !ok || st.GetDesiredRevision() < pe.rev {
		p.mu.Unlock()
		return
	}
	delete(p.pending, key)
	hist := p.hist
	p.mu.Unlock()
	hist.WithLabelValues(pe.kind).Observe(max(p.now().Sub(pe.since), 0).Seconds())
}

var unappliedDesc = prometheus.NewDesc("fleetstream_propagation_oldest_unapplied_seconds",
	"Age of the oldest change whose desired object the cluster's agent has not reported applied yet, by cluster, read at scrape "+
		"(the same clock as fleetstream_propagation_duration_seconds; no series while nothing of the cluster is pending). "+
		"A change counts from its first write: an object rewritten before it is applied keeps its age.",
	[]string{"cluster"}, nil)

// unapplied reports, per cluster, the age of the oldest pending change of every registered
// tracker, computed at each scrape so a cluster whose agent applies nothing shows an age that
// grows (the histogram only sees a change once it is applied, which a lost cluster never does).
// The cluster label is the first token of the desired key: a registered cluster's name, which
// an admin chose and the hub validated, bounded by the fleet's size.
type unapplied struct {
	mu       sync.Mutex
	trackers []*Propagation
}

func (u *unapplied) Describe(ch chan<- *prometheus.Desc) { ch <- unappliedDesc }

// MetricType says the gauge's type to the metric catalogue while no cluster has a series.
func (u *unapplied) MetricType() string { return "gauge" }

func (u *unapplied) Collect(ch chan<- prometheus.Metric) {
	u.mu.Lock()
	trackers := slices.Clone(u.trackers)
	u.mu.Unlock()
	oldest := map[string]float64{}
	for _, p := range trackers {
		for cluster, age := range p.oldestByCluster() {
			oldest[cluster] = max(oldest[cluster], age)
		}
	}
	for cluster, age := range oldest {
		ch <- prometheus.MustNewConstMetric(unappliedDesc, prometheus.GaugeValue, age, cluster)
	}
}

// oldestByCluster is the age in seconds of the oldest pending change per cluster. A key whose
// cluster token does not decode is left out rather than reported under a made-up name.
func (p *Propagation) oldestByCluster() map[string]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	since := map[string]time.Time{}
	for key, pe := range p.pending {
		tok, _, _ := strings.Cut(key, ".")
		cluster, err := keys.Decode(tok)
		if err != nil || cluster == "" {
			continue
		}
		if s, ok := since[cluster]; !ok || pe.since.Before(s) {
			since[cluster] = pe.since
		}
	}
	out := make(map[string]float64, len(since))
	for cluster, s := range since {
		out[cluster] = max(now.Sub(s), 0).Seconds()
	}
	return out
}
