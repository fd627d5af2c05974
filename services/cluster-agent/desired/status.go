package desired

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Reasons reported in AppliedStatus.
const (
	ReasonApplied           = "Applied"
	ReasonApplyFailed       = "ApplyFailed"
	ReasonOwnedByOther      = "OwnedByOther"
	ReasonManagedByOtherKey = "ManagedByOtherKey"
	ReasonInvalidObject     = "InvalidDesiredObject"
	ReasonUnknownKind       = "UnknownKind"
	ReasonTerminating       = "Terminating"
	ReasonDeleting          = "Deleting"
	ReasonDeleted           = "Deleted"
	ReasonDeleteFailed      = "DeleteFailed"
	ReasonReleased          = "Released"
	ReasonNotManaged        = "NotManaged"
	// ReasonProtectedNamespace: the object is a protected Namespace or lies in one
	// (Config.Protected); the applier refused it.
	ReasonProtectedNamespace = "ProtectedNamespace"
)

// readTimeout bounds reading a stored status; without it the status is simply written.
const readTimeout = 3 * time.Second

// reporter writes AppliedStatus into the applied bucket, only when it changed: the bucket's
// readers (API status, UIs) watch it, and an unchanged status is noise.
type reporter struct {
	js  jetstream.JetStream
	log *zap.Logger

	mu sync.Mutex
	kv jetstream.KeyValue
	// last is what this process last wrote (or read) per applied key.
	last map[string]*desiredv1.AppliedStatus
}

func newReporter(js jetstream.JetStream, log *zap.Logger) *reporter {
	return &reporter{js: js, log: log, last: map[string]*desiredv1.AppliedStatus{}}
}

// bucket opens the applied bucket on first use; until its owner created it, reports fail and
// their keys are retried.
func (r *reporter) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kv != nil {
		return r.kv, nil
	}
	kv, err := r.js.KeyValue(ctx, subjects.AppliedBucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", subjects.AppliedBucket, err)
	}
	r.kv = kv
	return kv, nil
}

// report writes st for desired key key of bucket unless the stored status is the same apart
// from its time.
func (r *reporter) report(ctx context.Context, bucket, key string, st *desiredv1.AppliedStatus) error {
	kv, err := r.bucket(ctx)
	if err != nil {
		return err
	}
	ak := subjects.AppliedKey(bucket, key)
	r.mu.Lock()
	prev, cached := r.last[ak]
	r.mu.Unlock()
	if !cached {
		// After a restart the previous process's statuses are still right for every key that
		// did not change: read before overwriting.
		prev = r.stored(ctx, kv, ak)
	}
	if sameStatus(prev, st) {
		r.remember(ak, prev)
		return nil
	}
	st = proto.CloneOf(st)
	st.Time = timestamppb.Now()
	data, err := proto.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode status of %s: %w", ak, err)
	}
	if _, err := kv.Put(ctx, ak, data); err != nil {
		return fmt.Errorf("put status %s: %w", ak, err)
	}
	r.remember(ak, st)
	return nil
}

// forget deletes the status of a key that is no longer desired.
func (r *reporter) forget(ctx context.Context, bucket, key string) error {
	kv, err := r.bucket(ctx)
	if err != nil {
		return err
	}
	ak := subjects.AppliedKey(bucket, key)
	r.mu.Lock()
	prev, cached := r.last[ak]
	r.mu.Unlock()
	if cached && prev == nil {
		return nil
	}
	if !cached && r.stored(ctx, kv, ak) == nil {
		r.remember(ak, nil)
		return nil
	}
	if err := kv.Delete(ctx, ak); err != nil {
		return fmt.Errorf("delete status %s: %w", ak, err)
	}
	r.remember(ak, nil)
	return nil
}

// stored reads the current status of ak; nil when there is none or it cannot be read (then
// the caller simply writes).
func (r *reporter) stored(ctx context.Context, kv jetstream.KeyValue, ak string) *desiredv1.AppliedStatus {
	// A hub whose permissions forbid the read drops the request silently: bound the wait.
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	e, err := kv.Get(ctx, ak)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			r.log.Debug("read applied status", zap.String("key", ak), zap.Error(err))
		}
		return nil
	}
	st := &desiredv1.AppliedStatus{}
	if err := proto.Unmarshal(e.Value(), st); err != nil {
		return nil
	}
	return st
}

func (r *reporter) remember(ak string, st *desiredv1.AppliedStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[ak] = st
}

// sameStatus compares two statuses apart from when they were written.
func sameStatus(a, b *desiredv1.AppliedStatus) bool {
	if a == nil || b == nil {
		return a == b
	}
	a, b = proto.CloneOf(a), proto.CloneOf(b)
	a.Time, b.Time = nil, nil
	a.Revision, b.Revision = 0, 0
	return proto.Equal(a, b)
}
