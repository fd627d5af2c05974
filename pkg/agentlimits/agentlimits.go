// Package agentlimits keeps one hub reader's verdicts on the agents' reports in bucket
// agent-limits (subjects.AgentLimitsBucket), which cluster-import shows as each cluster's
// AgentWithinLimits condition. The reader decides on its own goroutine and never waits for the
// bucket: Set records the verdict, Run writes it behind.
package agentlimits

import (
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Status is one reader's verdict per cluster: absent, the cluster is within its limits.
type Status struct {
	reader  string
	mu      sync.Mutex
	want    map[string]*clusterv1.Condition
	dirty   map[string]struct{}
	changed chan struct{}
}

// New returns the status of reader, its name in the bucket's keys.
func New(reader string) *Status {
	return &Status{reader: reader, want: map[string]*clusterv1.Condition{}, dirty: map[string]struct{}{}, changed: make(chan struct{}, 1)}
}

// Set records cluster's refusal; nil says it is within its limits.
func (s *Status) Set(cluster string, cond *clusterv1.Condition) {
	s.mu.Lock()
	if cond == nil {
		delete(s.want, cluster)
	} else {
		s.want[cluster] = cond
	}
	s.dirty[cluster] = struct{}{}
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Get returns cluster's refusal, nil when it is within its limits.
func (s *Status) Get(cluster string) *clusterv1.Condition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.want[cluster]
}

// Run makes the reader's entries of the bucket match the status until ctx ends: at start every
// entry a previous run left is checked once (a cluster over its limits before a restart that no
// longer is loses its entry), then each cluster as it changes, and whatever failed again every
// tick. Nothing the bucket answers stops it: a hub under load may time out a request, and the
// verdicts are not worth the service (at 10,000 clusters a timed-out lookup here once stopped
// fleetd).
func (s *Status) Run(ctx context.Context, js jetstream.JetStream, tick time.Duration, log *zap.Logger) error {
	kv, err := view.WaitBucket(ctx, js, subjects.AgentLimitsBucket, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	stale := map[string]string{} // key → cluster
	s.mu.Lock()
	for cluster := range s.want {
		s.dirty[cluster] = struct{}{}
	}
	s.mu.Unlock()
	listed := false
	for {
		// What a previous run left is listed until that works; the verdicts of this run are
		// written meanwhile, not held back by a listing that times out under load.
		if !listed {
			if err := s.listOwn(ctx, kv, stale); err != nil {
				log.Warn("agent limits bucket: listing this reader's entries", zap.String("reader", s.reader), zap.Error(err))
			} else {
				listed = true
			}
		}
		s.mu.Lock()
		for cluster := range s.dirty {
			stale[subjects.AgentLimitsKey(cluster, s.reader)] = cluster
		}
		clear(s.dirty)
		want := maps.Clone(s.want)
		s.mu.Unlock()
		for key, cluster := range stale {
			if err := write(ctx, kv, key, want[cluster]); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				log.Warn("agent limits bucket", zap.String("key", key), zap.Error(err))
				continue // tried again on the next change or tick
			}
			delete(stale, key)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.changed:
		case <-time.After(tick):
		}
	}
}

// listOwn adds the keys of this reader's entries to stale.
func (s *Status) listOwn(ctx context.Context, kv jetstream.KeyValue, stale map[string]string) error {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lister, err := kv.ListKeysFiltered(lctx, "*."+keys.Encode(s.reader))
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for k := range lister.Keys() {
		if cluster, err := keys.Decode(subjects.AgentLimitsKeyCluster(k)); err == nil {
			stale[k] = cluster
		}
	}
	return lctx.Err()
}

func write(ctx context.Context, kv jetstream.KeyValue, key string, cond *clusterv1.Condition) error {
	if cond == nil {
		if err := kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return err
		}
		return nil
	}
	data, err := proto.Marshal(cond)
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, key, data)
	return err
}
