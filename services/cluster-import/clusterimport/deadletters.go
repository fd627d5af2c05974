package clusterimport

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/topology"
)

// deadLettersEvery is how often cluster-import counts what FLEET_DLQ holds: one stream info
// request, far below a scrape's cost.
const deadLettersEvery = 30 * time.Second

// maxDeadLetterSources bounds the sources reported: every dead-letter subject is one a
// service's permissions allow (a stream and one of its consumers or views), so more means
// something is wrong, not that the gauge should grow.
const maxDeadLetterSources = 200

// runDeadLetters keeps fleetstream_dead_letters current: every replica reports the same
// stream, so alerts take the max over replicas.
func (s *Registry) runDeadLetters(ctx context.Context) error {
	t := time.NewTicker(deadLettersEvery)
	defer t.Stop()
	for {
		if err := s.countDeadLetters(ctx); err != nil && ctx.Err() == nil {
			s.log.Debug("counting dead letters", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Registry) countDeadLetters(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, topology.DeadLetterStreamName)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // nothing was ever dead-lettered here
	}
	if err != nil {
		return err
	}
	prefix := topology.DeadLetterSubjectPrefix + "."
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return err
	}
	s.deadLetterSources.set(s.metrics.deadLetters, info.State.Subjects)
	return nil
}

// deadLetterSources is what fleetstream_dead_letters reports now, so the next count deletes
// only the sources that vanished: a Reset would let a scrape between it and the Sets see no
// series at all, and FleetstreamDeadLettersGrowing would read the next sample as all new.
type deadLetterSources struct {
	mu    sync.Mutex
	shown map[string]struct{}
}

// set reports counts (FLEET_DLQ's messages by subject) on vec. Past the cap it keeps the first
// sources in subject order, the same ones every round: map order would report a different
// subset each time, each one "new" to the alert.
func (d *deadLetterSources) set(vec *prometheus.GaugeVec, counts map[string]uint64) {
	prefix := topology.DeadLetterSubjectPrefix + "."
	subjects := slices.Sorted(maps.Keys(counts))
	if len(subjects) > maxDeadLetterSources {
		subjects = subjects[:maxDeadLetterSources]
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	shown := make(map[string]struct{}, len(subjects))
	for _, subject := range subjects {
		source := strings.TrimPrefix(subject, prefix)
		shown[source] = struct{}{}
		vec.WithLabelValues(source).Set(float64(counts[subject]))
	}
	// A source whose messages expired (the stream's MaxAge) or were purged goes away.
	for source := range d.shown {
		if _, ok := shown[source]; !ok {
			vec.DeleteLabelValues(source)
		}
	}
	d.shown = shown
}
