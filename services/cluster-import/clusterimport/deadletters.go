package clusterimport

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
	// A source whose messages expired (the stream's MaxAge) or were purged goes away.
	s.metrics.deadLetters.Reset()
	n := 0
	for subject, count := range info.State.Subjects {
		if n++; n > maxDeadLetterSources {
			break
		}
		s.metrics.deadLetters.WithLabelValues(strings.TrimPrefix(subject, prefix)).Set(float64(count))
	}
	return nil
}
