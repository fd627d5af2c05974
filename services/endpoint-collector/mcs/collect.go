package mcs

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// stored is one desired-mcs entry as this writer last wrote or read it.
type stored struct {
	data []byte
	rev  uint64
}

// collect removes the tombstone at key (revision rev) from desired-mcs once the cluster's agent
// has confirmed, in bucket `applied`, that the object is gone at that revision or later, and
// reports whether it did. Without it every ServiceImport and EndpointSlice a project member
// ever caused left a tombstone for good: exporting and unexporting services under new names
// grew the bucket without bound.
//
// The tombstone's messages are purged from the bucket's stream up to rev, not deleted with a
// KV delete: a delete would leave a marker per key for ever (rbac-sync's writer purges its
// markers an hour later; here nothing needs one). An agent watching now is not told; its
// copy of the tombstone goes at its next replay (at most kvfeed's resync later), which finds
// the key absent and drops the status it kept for it. A put after rev is never purged (the
// bound is rev+1), so a writer that moved on since cannot lose its write.
func (s *Service) collect(ctx context.Context, key string, rev uint64) (bool, error) {
	confirmed, err := s.confirmedAbsent(ctx, key, rev)
	if err != nil || !confirmed {
		return false, err
	}
	stream, err := s.js.Stream(ctx, "KV_"+subjects.DesiredMCSBucket)
	if err != nil {
		return false, fmt.Errorf("collect tombstone %s: %w", key, err)
	}
	subj := "$KV." + subjects.DesiredMCSBucket + "." + key
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeSequence(rev+1)); err != nil {
		return false, fmt.Errorf("collect tombstone %s: %w", key, err)
	}
	return true, nil
}

// confirmedAbsent reports whether the agent's status of desired key says the object is gone
// at revision rev or later. No status, or no bucket yet, is "not yet".
func (s *Service) confirmedAbsent(ctx context.Context, key string, rev uint64) (bool, error) {
	kv, err := s.appliedBucket(ctx)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	e, err := kv.Get(ctx, subjects.AppliedKey(subjects.DesiredMCSBucket, key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("status of %s: %w", key, err)
	}
	st := &desiredv1.AppliedStatus{}
	if err := proto.Unmarshal(e.Value(), st); err != nil {
		// An agent's bad write must not stop collection elsewhere; this key waits.
		return false, nil
	}
	return st.GetAbsent() && st.GetDesiredRevision() >= rev, nil
}

func (s *Service) appliedBucket(ctx context.Context) (jetstream.KeyValue, error) {
	s.mu.Lock()
	kv := s.applied
	s.mu.Unlock()
	if kv != nil {
		return kv, nil
	}
	kv, err := s.js.KeyValue(ctx, subjects.AppliedBucket)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.applied = kv
	s.mu.Unlock()
	return kv, nil
}
