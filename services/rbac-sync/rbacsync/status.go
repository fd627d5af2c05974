package rbacsync

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// statusCache mirrors what agents reported about rbac-sync's desired keys: the part of bucket
// `applied` under `desired-rbac.`, keyed by the desired key.
type statusCache struct {
	js       jetstream.JetStream
	log      *zap.Logger
	replicas int // of the applied bucket, should this service be the first to need it

	mu      sync.RWMutex
	items   map[string]*desiredv1.AppliedStatus
	changed chan struct{}

	ready     chan struct{}
	readyOnce sync.Once
}

func newStatusCache(js jetstream.JetStream, replicas int, log *zap.Logger) *statusCache {
	return &statusCache{js: js, log: log, replicas: replicas, items: map[string]*desiredv1.AppliedStatus{}, changed: make(chan struct{}), ready: make(chan struct{})}
}

func (c *statusCache) Ready() <-chan struct{} { return c.ready }

// Run watches the bucket until ctx ends, re-establishing the watch if it fails.
func (c *statusCache) Run(ctx context.Context) error {
	delay := 250 * time.Millisecond
	for ctx.Err() == nil {
		err := c.watch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		c.log.Warn("applied-status watch ended; retrying", zap.Error(err), zap.Duration("in", delay))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
	return nil
}

func (c *statusCache) watch(ctx context.Context) error {
	kv, err := c.js.KeyValue(ctx, subjects.AppliedBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		// Agents write it; whoever comes first creates it, and only if it is missing, so the
		// configuration of whoever created it stays.
		kv, err = c.js.CreateOrUpdateKeyValue(ctx, subjects.AppliedBucketConfig(c.replicas))
	}
	if err != nil {
		return fmt.Errorf("applied bucket: %w", err)
	}
	prefix := subjects.AppliedKey(subjects.DesiredRBACBucket, "")
	w, err := kv.Watch(ctx, prefix+">")
	if err != nil {
		return fmt.Errorf("watch applied: %w", err)
	}
	defer func() { _ = w.Stop() }()
	fresh := map[string]*desiredv1.AppliedStatus{}
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch closed")
			}
			if e == nil {
				c.mu.Lock()
				c.items = fresh
				c.mu.Unlock()
				initial = false
				c.readyOnce.Do(func() { close(c.ready) })
				continue
			}
			key := strings.TrimPrefix(e.Key(), prefix)
			var st *desiredv1.AppliedStatus
			if e.Operation() == jetstream.KeyValuePut {
				st = &desiredv1.AppliedStatus{}
				if err := proto.Unmarshal(e.Value(), st); err != nil {
					c.log.Warn("undecodable applied status", zap.String("key", e.Key()), zap.Error(err))
					continue
				}
			}
			if initial {
				if st != nil {
					fresh[key] = st
				}
				continue
			}
			c.mu.Lock()
			if st != nil {
				c.items[key] = st
			} else {
				delete(c.items, key)
			}
			close(c.changed)
			c.changed = make(chan struct{})
			c.mu.Unlock()
		}
	}
}

func (c *statusCache) get(desiredKey string) (*desiredv1.AppliedStatus, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	st, ok := c.items[desiredKey]
	return st, ok
}
