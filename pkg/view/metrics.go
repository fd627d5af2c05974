package view

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics reports every registered engine's progress, read from the engines at each scrape so
// a stalled engine shows as stalled rather than as its last update. The services of one process
// (fleetd) share one: a Set registering after another adds its engines to the first's.
type metrics struct {
	leading, applied, pending, lag, ready *prometheus.GaugeVec

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
			Help: "Events of the view's stream after the last one its leader applied, read at scrape: the stream sequences from it to the last event of the view's subjects (more than the events where the stream interleaves other subjects), or as of the last delivery when the stream does not answer (0 in a replica that does not lead)."}, []string{"view"}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetstream_view_lag_seconds",
			Help: "Age of the oldest event of the view's subjects its leader has not applied, read at scrape: now minus that event's stream time, 0 when nothing is pending (and in a replica that does not lead)."}, []string{"view"}),
		ready: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetstream_view_time_to_ready_seconds",
			Help: "Seconds from this replica's start of the view's engine until the view was ready (caught up with the stream as it was at start, by leading or following); no series until it is."}, []string{"view"}),
	}
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.leading.Describe(ch)
	m.applied.Describe(ch)
	m.pending.Describe(ch)
	m.lag.Describe(ch)
	m.ready.Describe(ch)
}

// streamLastTTL is how long a view's stream's last sequence read at a scrape is reused: a
// scrape costs each leading view one or a few stream requests at most this often.
const streamLastTTL = 2 * time.Second

// scrapeTimeout bounds the stream requests of one scrape: an unanswered one falls back to the
// lag as of the last delivery rather than hold the scrape.
const scrapeTimeout = 2 * time.Second

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	var wg sync.WaitGroup
	pending := make([]float64, len(m.engines))
	lag := make([]float64, len(m.engines))
	leading := make([]bool, len(m.engines))
	applied := make([]uint64, len(m.engines))
	for i, e := range m.engines {
		e.mu.Lock()
		leading[i], applied[i] = e.leading, e.applied
		e.mu.Unlock()
		if leading[i] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pending[i] = float64(e.pendingNow(ctx, applied[i]))
				if pending[i] > 0 {
					lag[i] = e.lagNow(ctx, applied[i])
				}
			}()
		}
	}
	wg.Wait()
	for i, e := range m.engines {
		var lead float64
		if leading[i] {
			lead = 1
		}
		m.leading.WithLabelValues(e.p.Name).Set(lead)
		m.applied.WithLabelValues(e.p.Name).Set(float64(applied[i]))
		m.pending.WithLabelValues(e.p.Name).Set(pending[i])
		m.lag.WithLabelValues(e.p.Name).Set(lag[i])
		if d := e.readyAfter.Load(); d > 0 {
			m.ready.WithLabelValues(e.p.Name).Set(time.Duration(d).Seconds())
		}
	}
	m.mu.Unlock()
	m.leading.Collect(ch)
	m.applied.Collect(ch)
	m.pending.Collect(ch)
	m.lag.Collect(ch)
	m.ready.Collect(ch)
}

// Register registers the metrics of the set's views on reg (fleetstream_view_leading,
// fleetstream_view_applied_sequence, fleetstream_view_pending_events, fleetstream_view_lag_seconds,
// fleetstream_view_time_to_ready_seconds), for the service's Mount.
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

// pendingNow is the leader's lag at this scrape: the stream's last event of the view's subjects
// (read at most every streamLastTTL) minus applied. Reading it here rather than at each batch
// is what shows a leader stuck in a batch while it was caught up: no batch ends, so a lag kept
// per batch would stay 0 as events pile up. Without an answer from the stream, the lag as of the
// last delivery.
func (e *Engine) pendingNow(ctx context.Context, applied uint64) uint64 {
	e.streamLastMu.Lock()
	defer e.streamLastMu.Unlock()
	if time.Since(e.streamLastAt) >= streamLastTTL {
		last, err := e.streamLast(ctx)
		if err != nil {
			return e.pending.Load()
		}
		e.streamLastSeq, e.streamLastAt = last, time.Now()
	}
	if e.streamLastSeq <= applied {
		return 0
	}
	return e.streamLastSeq - applied
}

// lagNow is the age of the first event of the view's subjects after applied, read from the
// stream once per applied sequence (the event a stalled leader waits on does not change). The
// age is counted on the wall clock, as the stream's times are. Without an answer, the age of
// the event last read (an upper bound: the leader has applied nothing newer than it, or more
// and the next is younger), or 0 if none was.
func (e *Engine) lagNow(ctx context.Context, applied uint64) float64 {
	e.streamLastMu.Lock()
	defer e.streamLastMu.Unlock()
	if !e.nextKnown || e.nextAfter != applied {
		t, ok, err := nextEventTime(ctx, e.js, e.p, applied)
		switch {
		case err != nil && !e.nextKnown:
			return 0
		case err == nil && !ok:
			return 0 // nothing after applied yet: the pending count was read a moment earlier
		case err == nil:
			e.nextAfter, e.nextTime, e.nextKnown = applied, t, true
		}
	}
	return max(time.Now().Round(0).Sub(e.nextTime), 0).Seconds()
}

// nextEventTime returns the stream time of the first message after seq that p reads.
func nextEventTime(ctx context.Context, js jetstream.JetStream, p Projection, seq uint64) (time.Time, bool, error) {
	s, err := js.Stream(ctx, p.Stream)
	if err != nil {
		return time.Time{}, false, err
	}
	filters := p.Subjects
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var first *jetstream.RawStreamMsg
	for _, subj := range filters {
		m, err := s.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return time.Time{}, false, err
		}
		if first == nil || m.Sequence < first.Sequence {
			first = m
		}
	}
	if first == nil {
		return time.Time{}, false, nil
	}
	return first.Time, true, nil
}
