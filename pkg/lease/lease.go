// Package lease elects one holder among the replicas of a service with a lease in a JetStream
// KV bucket, so work that needs a single writer (a view's projection engine, a fan-out into a
// desired bucket) runs in exactly one replica at a time and moves to another when that one dies.
//
// The protocol, on key <name> of bucket fleet-leases:
//
//   - acquire: KV Create (succeeds only if the key is absent or deleted);
//   - renew: KV Update with the revision of the holder's last write, every ttl/3;
//   - lose: a renewal rejected for a revision mismatch (someone else wrote or deleted the key),
//     or no successful renewal for 2/3 ttl, measured with the holder's monotonic clock from when
//     it sent its last successful write. The work's context is cancelled at once;
//   - take over: a contender that has seen the same revision of the key for a whole ttl (its own
//     monotonic clock, counted from when it first read that revision, which is after the holder
//     sent it) replaces it with Update on that revision; a key that expired (the bucket's MaxAge
//     equals the TTL) or was deleted is taken with Create;
//   - release: Delete on the holder's revision when it stops cleanly; contenders watch the key and
//     take it at once.
//
// So a holder gives up at least ttl/3 before anyone may take over, with no reliance on wall
// clocks agreeing. What a lease cannot do is stop a write the old holder already has in flight
// when it gives up (there is no fencing token); writers that need more check their context before
// each write round and use compare-and-set where they can (see pkg/view).
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/events"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// Bucket is the KV bucket that holds every lease, one key per lease name.
const Bucket = "fleet-leases"

// DefaultTTL is the lease TTL services use, and the bucket's MaxAge: a holder renews every
// ttl/3, stops its work when it could not renew for 2/3 ttl, and is replaced within about ttl
// of its last renewal. A TTL above the bucket's MaxAge is refused (the key would expire under a
// live holder).
const DefaultTTL = 5 * time.Second

// BucketConfig is the configuration of the lease bucket. Keys expire DefaultTTL after their
// last write, so the lease of a holder that died without releasing it disappears even if no
// contender is watching.
func BucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "Leader leases: one key per single-writer task, held by one replica (pkg/lease).",
		History:     1,
		TTL:         DefaultTTL,
		Storage:     jetstream.FileStorage,
	}
}

// Topology declares the lease bucket, for services to ensure with the rest of theirs. Run
// creates it when it is missing, so declaring it is optional.
func Topology() topology.Topology {
	return topology.Topology{Buckets: []jetstream.KeyValueConfig{BucketConfig()}}
}

// Open returns the lease bucket, creating it with the given replicas if it does not exist. An
// existing bucket is left as it is: topology.Ensure owns its configuration, and callers with
// different replica counts must not flip it back and forth.
func Open(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("lease bucket: %w", err)
	}
	cfg := BucketConfig()
	cfg.Replicas = max(replicas, 1)
	if kv, err = js.CreateOrUpdateKeyValue(ctx, cfg); err != nil {
		return nil, fmt.Errorf("create lease bucket: %w", err)
	}
	return kv, nil
}

// DefaultHolder names this process in lease values: host name and process id. Each Run adds a
// random suffix, so two Runs of one process never mistake each other's lease for their own.
func DefaultHolder() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown"
	}
	return host + "/" + strconv.Itoa(os.Getpid())
}

// Option tunes Run.
type Option func(*options)

type options struct {
	log      *zap.Logger
	replicas int
	standby  func(ctx context.Context) error
	metrics  *Metrics
}

// WithLogger logs acquisitions, losses and releases to log.
func WithLogger(log *zap.Logger) Option { return func(o *options) { o.log = log } }

// WithReplicas sets the replicas of the lease bucket if Run has to create it (default 1).
func WithReplicas(n int) Option { return func(o *options) { o.replicas = n } }

// WithStandby runs standby whenever this Run has found the lease held by someone else, until it
// acquires the lease: standby's context is cancelled then, and fn starts only after standby has
// returned. Followers use it to track what the holder writes. An error from standby ends Run.
func WithStandby(standby func(ctx context.Context) error) Option {
	return func(o *options) { o.standby = standby }
}

// openAttempt bounds one attempt to open the lease bucket.
const openAttempt = 10 * time.Second

// openRetrying opens the lease bucket, again after an error NATS gets over (a request that timed
// out while a three-node cluster forms, no leader yet): a compose stack's cluster-import exited
// on one at start (docs/scale.md), and in fleetd such an exit stops every service.
func openRetrying(ctx context.Context, js jetstream.JetStream, replicas int, name string, log *zap.Logger) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := events.Retry(ctx, log.With(zap.String("lease", name)), "lease bucket unavailable", func() error {
		// Each attempt is bounded: a request sent while the connection is down may never be
		// answered, and the bucket handle does not keep the context.
		actx, cancel := context.WithTimeout(ctx, openAttempt)
		defer cancel()
		var err error
		kv, err = Open(actx, js, replicas)
		return err
	})
	return kv, err
}

// Run holds lease name on behalf of holder and runs fn while it does, until ctx is done.
//
// fn runs with a context that is cancelled as soon as the lease is lost or could not be
// renewed for 2/3 ttl; Run waits for fn to return and then tries to acquire the lease again.
// When fn returns on its own, or ctx ends, Run releases the lease (so another replica takes
// over at once) and returns fn's error (nil when ctx ended). fn may therefore run many times,
// never twice at once.
func Run(ctx context.Context, js jetstream.JetStream, name, holder string, ttl time.Duration,
	fn func(ctx context.Context) error, opts ...Option) error {
	o := options{log: zap.NewNop(), replicas: 1}
	for _, opt := range opts {
		opt(&o)
	}
	if ttl < 30*time.Millisecond {
		return fmt.Errorf("lease %s: ttl %s is too short", name, ttl)
	}
	kv, err := openRetrying(ctx, js, o.replicas, name, o.log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("lease %s: %w", name, err)
	}
	if st, err := kv.Status(ctx); err == nil && st.TTL() > 0 && ttl > st.TTL() {
		return fmt.Errorf("lease %s: ttl %s exceeds the lease bucket's %s", name, ttl, st.TTL())
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	r := &runner{
		kv: kv, key: name, ttl: ttl, fn: fn, standby: o.standby, metrics: o.metrics,
		value: []byte(holder + "#" + hex.EncodeToString(id[:])),
		log:   o.log.With(zap.String("lease", name)),
		wake:  make(chan struct{}, 1),
	}
	return r.run(ctx)
}

type runner struct {
	kv      jetstream.KeyValue
	key     string
	value   []byte // holder#random: this Run's identity in the key
	ttl     time.Duration
	fn      func(ctx context.Context) error
	standby func(ctx context.Context) error
	metrics *Metrics
	log     *zap.Logger
	// wake is signalled when the watch sees the key changed by someone else.
	wake chan struct{}
}

// opTimeout bounds one read or write of the lease. nats.go waits 5 s for a JetStream answer by
// default, and a write sent while the lease bucket has no leader (a NATS node was lost and its
// Raft groups are electing) is never answered: unbounded, the first write after the election
// could start up to 5 s + ttl/3 late, and every view of a service with it.
func (r *runner) opTimeout() time.Duration {
	return max(min(r.ttl/5, time.Second), 50*time.Millisecond)
}

// retryWait is how soon a failed read or write of the lease is tried again.
func (r *runner) retryWait() time.Duration { return min(r.ttl/3, 250*time.Millisecond) }

// withTimeout runs op with a context that ends after d at the latest.
func withTimeout[T any](ctx context.Context, d time.Duration, op func(ctx context.Context) (T, error)) (T, error) {
	octx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return op(octx)
}

func (r *runner) run(ctx context.Context) error {
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	// Watching before contending: no change after the first read goes unnoticed.
	w, _ := r.kv.Watch(wctx, r.key, jetstream.UpdatesOnly())
	go r.watch(wctx, w)
	for {
		r.metrics.set(r.key, false)
		rev, sent, err := r.contend(ctx)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		r.metrics.set(r.key, true)
		lost, err := r.hold(ctx, rev, sent)
		r.metrics.set(r.key, false)
		if !lost || ctx.Err() != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// watch signals wake whenever the key is written by anyone else, or deleted: a holder checks
// its lease at once, a contender looks whether it is free.
func (r *runner) watch(ctx context.Context, w jetstream.KeyWatcher) {
	for ctx.Err() == nil {
		var err error
		if w == nil {
			w, err = r.kv.Watch(ctx, r.key, jetstream.UpdatesOnly())
		}
		if err == nil {
			for e := range w.Updates() {
				if e == nil || (e.Operation() == jetstream.KeyValuePut && string(e.Value()) == string(r.value)) {
					continue
				}
				select {
				case r.wake <- struct{}{}:
				default:
				}
			}
			_ = w.Stop()
			w = nil
		}
		// Closed (connection lost, or ctx done) or not started: polling covers the gap.
		select {
		case <-ctx.Done():
		case <-time.After(r.ttl / 3):
		}
	}
}

// contend returns once this Run holds the lease, with the revision it wrote and when it sent
// that write; or with ctx done, or standby's error. Standby runs while someone else holds it.
func (r *runner) contend(ctx context.Context) (uint64, time.Time, error) {
	var (
		sbCancel context.CancelFunc
		sbDone   chan error
	)
	stopStandby := func() error {
		if sbDone == nil {
			return nil
		}
		sbCancel()
		err := <-sbDone
		sbDone = nil
		return err
	}
	var (
		seenRev    uint64    // revision of the key last read
		seenAt     time.Time // when seenRev was first read (monotonic)
		seenHolder string
		failures   int
	)
	for {
		if ctx.Err() != nil {
			_ = stopStandby()
			return 0, time.Time{}, nil
		}
		if sbDone != nil {
			select {
			case err := <-sbDone:
				sbDone = nil
				if ctx.Err() == nil && err != nil {
					return 0, time.Time{}, err
				}
			default:
			}
		}
		wait := r.ttl / 3
		e, err := withTimeout(ctx, r.opTimeout(), func(ctx context.Context) (jetstream.KeyValueEntry, error) {
			return r.kv.Get(ctx, r.key)
		})
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			sent := time.Now()
			rev, err := withTimeout(ctx, r.opTimeout(), func(ctx context.Context) (uint64, error) {
				return r.kv.Create(ctx, r.key, r.value)
			})
			if err == nil {
				if err := stopStandby(); err != nil && ctx.Err() == nil {
					r.release(rev)
					return 0, time.Time{}, err
				}
				r.log.Info("lease acquired", zap.String("holder", string(r.value)), zap.Uint64("revision", rev))
				return rev, sent, nil
			}
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // someone was quicker: read who
			}
			failures++
			wait = r.retryWait()
			r.logFailure(ctx, failures, "create lease", err)
		case err != nil:
			failures++
			wait = r.retryWait()
			r.logFailure(ctx, failures, "read lease", err)
		default:
			failures = 0
			now := time.Now()
			if e.Revision() != seenRev {
				seenRev, seenAt = e.Revision(), now
			}
			// Our own value: a write of ours whose answer was lost; nobody else works under it.
			mine := string(e.Value()) == string(r.value)
			if h := string(e.Value()); h != seenHolder && !mine {
				seenHolder = h
				r.log.Info("lease held by another holder; standing by", zap.String("holder", h))
			}
			if held := now.Sub(seenAt); held >= r.ttl || mine {
				// Not renewed for a whole TTL: its holder has given up long ago.
				sent := time.Now()
				rev, err := withTimeout(ctx, r.opTimeout(), func(ctx context.Context) (uint64, error) {
					return r.kv.Update(ctx, r.key, r.value, seenRev)
				})
				if err == nil {
					if err := stopStandby(); err != nil && ctx.Err() == nil {
						r.release(rev)
						return 0, time.Time{}, err
					}
					r.log.Info("lease taken over from a holder that stopped renewing", zap.String("from", seenHolder),
						zap.String("holder", string(r.value)), zap.Uint64("revision", rev))
					return rev, sent, nil
				}
				if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
					continue // renewed, taken, deleted or expired meanwhile: read again
				}
				failures++
				wait = r.retryWait()
				r.logFailure(ctx, failures, "take over lease", err)
			} else {
				wait = min(wait, r.ttl-held)
			}
			if r.standby != nil && sbDone == nil {
				sctx, cancel := context.WithCancel(ctx)
				sbCancel, sbDone = cancel, make(chan error, 1)
				go func() { sbDone <- r.standby(sctx) }()
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-t.C:
		case err := <-sbDone:
			sbDone = nil
			if ctx.Err() == nil && err != nil {
				t.Stop()
				return 0, time.Time{}, err
			}
		}
		t.Stop()
	}
}

func (r *runner) logFailure(ctx context.Context, n int, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	if n == 1 || n%20 == 0 {
		r.log.Warn(what+" failed; retrying", zap.Int("attempt", n), zap.Error(err))
	}
}

// hold runs fn while renewing the lease. It reports lost when the lease was lost (fn has
// returned and Run should contend again); otherwise fn returned on its own or ctx ended, and the
// lease has been released.
func (r *runner) hold(ctx context.Context, rev uint64, sent time.Time) (lost bool, err error) {
	renewEvery, giveUp := r.ttl/3, r.ttl*2/3
	deadline := sent.Add(giveUp)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.fn(lctx) }()
	loseWith := func(msg string, fields ...zap.Field) (bool, error) {
		cancel()
		r.log.Warn(msg, fields...)
		<-done
		return true, nil
	}
	if time.Until(deadline) <= 0 {
		return loseWith("lease lost: acquired too long ago to trust")
	}
	renew := time.NewTimer(time.Until(sent.Add(renewEvery)))
	defer renew.Stop()
	expire := time.NewTimer(time.Until(deadline))
	defer expire.Stop()
	failures := 0
	for {
		select {
		case err := <-done:
			r.release(rev)
			if ctx.Err() != nil {
				return false, nil
			}
			return false, err
		case <-ctx.Done():
			<-done
			r.release(rev)
			return false, nil
		case <-expire.C:
			return loseWith("lease lost: not renewed in time; stopping work", zap.Duration("ttl", r.ttl))
		case <-r.wake:
		case <-renew.C:
		}
		// Renew, bounded by the deadline (past it the work stops anyway) and by opTimeout, so
		// a bucket that elects a new leader before the deadline is renewed on.
		start := time.Now()
		rctx, rcancel := context.WithDeadline(ctx, deadline)
		next, err := withTimeout(rctx, r.opTimeout(), func(ctx context.Context) (uint64, error) {
			return r.kv.Update(ctx, r.key, r.value, rev)
		})
		rcancel()
		switch {
		case err == nil:
			rev, failures = next, 0
			deadline = start.Add(giveUp)
			expire.Reset(time.Until(deadline))
			renew.Reset(time.Until(start.Add(renewEvery)))
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists):
			// A renewal that timed out may have been stored anyway: the key then holds this Run's
			// own value at a newer revision, and nobody else has written it. Hold on at that
			// revision; the deadline stays, as when that write was sent is not known. (Newer:
			// a replica answering a read may lag and show an older write of ours.)
			if e, gerr := withTimeout(ctx, r.opTimeout(), func(ctx context.Context) (jetstream.KeyValueEntry, error) {
				return r.kv.Get(ctx, r.key)
			}); gerr == nil && e.Operation() == jetstream.KeyValuePut && e.Revision() > rev && string(e.Value()) == string(r.value) {
				rev = e.Revision()
				renew.Reset(0)
				continue
			}
			return loseWith("lease lost: the key was changed by someone else; stopping work", zap.Error(err))
		case ctx.Err() != nil:
			renew.Reset(0) // ctx.Done is taken on the next turn
		default:
			failures++
			r.logFailure(ctx, failures, "renew lease", err)
			renew.Reset(min(renewEvery/4, 250*time.Millisecond))
		}
	}
}

// release deletes the lease if it is still at rev, so a contender takes it at once.
func (r *runner) release(rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), min(r.ttl/3, 2*time.Second))
	defer cancel()
	if err := r.kv.Delete(ctx, r.key, jetstream.LastRevision(rev)); err != nil {
		r.log.Info("lease not released (it expires by itself)", zap.Error(err))
		return
	}
	r.log.Info("lease released", zap.String("holder", string(r.value)))
}
