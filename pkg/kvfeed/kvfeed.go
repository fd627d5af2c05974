// Package kvfeed watches the keys of a KV bucket under a filter, as jetstream.KeyValue.Watch
// does, without holding a JetStream consumer while it waits for changes.
//
// A KV watch is an ordered consumer per watcher. With one watcher per member cluster on each
// desired-state bucket, the hub held three consumers per cluster: nats-server refuses consumers
// past its per-stream limit (the 1,001st cluster got nothing), and every stored message was
// matched against every consumer's filter, so a change on N clusters cost N² (issue 26).
//
// A Watcher replays the filtered keys with a short-lived ordered consumer (the latest value of
// each key, deletes included; the replay ends with a nil entry, as a KV watch's does) and
// receives every later change from the bucket's republish (subjects.FeedRePublish) through a
// core NATS subscription made before the replay started. Each change carries its stream
// sequence and the sequence of the previous message of its key, so the merge of the two
// sources keeps the newest value per key, and a change whose predecessor was never seen shows
// that something was lost. The Watcher then ends with ErrResync, and the caller watches again:
//   - after a reconnect (core NATS delivers nothing while disconnected),
//   - when the subscription dropped messages (a slow consumer),
//   - when a key's previous sequence is not the one last seen (a lost change),
//   - when sequences go backwards (the bucket was deleted and created again),
//   - every Options.Resync (jittered), the safety net for what none of those can see: a change
//     republished by nobody while the stream's leader changed, or lost on a route while the
//     subscription's interest propagated through a NATS cluster.
//
// A bucket that does not republish to the feed (a hub older than its agents) is watched as
// before: the replay consumer stays and delivers the changes.
package kvfeed

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// ErrResync ends a Watcher whose view may have missed a change: watch again for a fresh replay.
var ErrResync = errors.New("kvfeed: resync")

// Defaults for zero Options fields.
const (
	DefaultSettle = time.Second
	DefaultBuffer = 4096
	// maxPending bounds the live changes held while the replay runs; past it the replay is
	// abandoned (ErrResync) rather than the memory.
	maxPending = 100_000
	// flushTimeout bounds the wait for the server to confirm the subscription, setupTimeout
	// every other request of a watch's setup.
	flushTimeout = 10 * time.Second
	setupTimeout = 10 * time.Second
)

// Options tune a Watcher; the zero value is usable.
type Options struct {
	// Resync ends the Watcher with ErrResync after this long, ±25% so that a fleet of agents
	// started together does not replay together. 0 never does.
	Resync time.Duration
	// Settle keeps the replay consumer this long after its replay, its changes merged with
	// the subscription's: in a NATS cluster the subscription's interest reaches the stream
	// leader's server asynchronously, and a change stored meanwhile reaches only the consumer.
	// Default DefaultSettle.
	Settle time.Duration
	// Buffer is the subscription's channel capacity; a change that finds it full is dropped
	// by the client and the Watcher resyncs. Default DefaultBuffer.
	Buffer int
}

// Watcher delivers the replay of the filtered keys, a nil entry, then every change.
type Watcher struct {
	updates chan jetstream.KeyValueEntry
	cancel  context.CancelFunc
	done    chan struct{}
	err     error
	live    bool
}

// Watch starts watching the keys of bucket that match filter (a KV key filter such as
// "cluster.>" or one key).
func Watch(ctx context.Context, js jetstream.JetStream, bucket, filter string, o Options) (*Watcher, error) {
	if o.Settle <= 0 {
		o.Settle = DefaultSettle
	}
	if o.Buffer <= 0 {
		o.Buffer = DefaultBuffer
	}
	// Every request of the setup is bounded: a request lost while the connection reconnects
	// is otherwise waited for as long as ctx lives (an agent's: forever), and the watch with it.
	sctx, scancel := context.WithTimeout(ctx, setupTimeout)
	defer scancel()
	kv, err := js.KeyValue(sctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	st, err := kv.Status(sctx)
	if err != nil {
		return nil, fmt.Errorf("bucket %s status: %w", bucket, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &Watcher{
		updates: make(chan jetstream.KeyValueEntry, 256),
		cancel:  cancel,
		done:    make(chan struct{}),
		live:    reflect.DeepEqual(st.Config().RePublish, subjects.FeedRePublish(bucket)),
	}
	r := &run{w: w, bucket: bucket, prefix: "$KV." + bucket + ".", o: o, known: map[string]rev{}}
	if w.live {
		nc := js.Conn()
		r.msgs = make(chan *nats.Msg, o.Buffer)
		// Subscribed, and the subscription known to the server, before the replay starts, so
		// that every change after the replay's snapshot reaches one of the two.
		if r.sub, err = nc.ChanSubscribe(subjects.FeedSubject(bucket, filter), r.msgs); err != nil {
			cancel()
			return nil, fmt.Errorf("subscribe to %s: %w", subjects.FeedSubject(bucket, filter), err)
		}
		fctx, fcancel := context.WithTimeout(ctx, flushTimeout)
		err := nc.FlushWithContext(fctx)
		fcancel()
		if err != nil {
			_ = r.sub.Unsubscribe()
			cancel()
			return nil, fmt.Errorf("subscribe to %s: %w", subjects.FeedSubject(bucket, filter), err)
		}
		r.status = nc.StatusChanged(nats.CONNECTED)
		r.nc = nc
	}
	if r.replay, err = startReplay(wctx, cancel, kv, filter); err != nil {
		r.close()
		cancel()
		return nil, fmt.Errorf("watch %s %s: %w", bucket, filter, err)
	}
	go func() {
		defer close(w.done)
		defer close(w.updates)
		defer r.close()
		w.err = r.loop(wctx)
	}()
	return w, nil
}

// startReplay starts the replay consumer within setupTimeout. The consumer lives as long as
// wctx, which also bounds the request creating it: on timeout, cancel ends that request.
func startReplay(wctx context.Context, cancel context.CancelFunc, kv jetstream.KeyValue, filter string) (jetstream.KeyWatcher, error) {
	type started struct {
		w   jetstream.KeyWatcher
		err error
	}
	ch := make(chan started, 1)
	go func() {
		w, err := kv.Watch(wctx, filter)
		ch <- started{w, err}
	}()
	select {
	case s := <-ch:
		return s.w, s.err
	case <-time.After(setupTimeout):
		cancel()
		if s := <-ch; s.w != nil {
			_ = s.w.Stop()
		}
		return nil, fmt.Errorf("replay consumer not created within %v", setupTimeout)
	}
}

// Updates delivers the replay, nil once it is complete, then every change. It is closed when
// the Watcher ends; Err then says why.
func (w *Watcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }

// Err is why Updates was closed: nil after Stop or the end of the context, ErrResync (wrapped
// with the reason) when the caller should watch again at once, another error otherwise. Read
// it only after Updates is closed.
func (w *Watcher) Err() error { return w.err }

// Live reports whether changes come from the bucket's republish (false: from a consumer, the
// bucket does not republish to the feed).
func (w *Watcher) Live() bool { return w.live }

// Stop ends the Watcher and releases its subscription and consumer.
func (w *Watcher) Stop() error {
	w.cancel()
	<-w.done
	return nil
}

// rev is the last change of a key seen by a Watcher.
type rev struct {
	seq     uint64
	deleted bool
	created time.Time
}

type run struct {
	w      *Watcher
	bucket string
	prefix string // "$KV.<bucket>."
	o      Options
	nc     *nats.Conn
	sub    *nats.Subscription
	msgs   chan *nats.Msg
	status chan nats.Status
	replay jetstream.KeyWatcher
	known  map[string]rev
	// liveMax is the last sequence the subscription delivered.
	liveMax uint64
}

func (r *run) close() {
	if r.replay != nil {
		_ = r.replay.Stop()
	}
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
	}
	if r.status != nil {
		r.nc.RemoveStatusListener(r.status)
	}
}

func (r *run) loop(ctx context.Context) error {
	var resync <-chan time.Time
	if r.o.Resync > 0 {
		d := r.o.Resync*3/4 + rand.N(r.o.Resync/2+1)
		t := time.NewTimer(d)
		defer t.Stop()
		resync = t.C
	}
	replay := r.replay.Updates()
	var (
		replayed bool
		settled  bool
		settle   <-chan time.Time
		pending  []*nats.Msg
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-resync:
			return fmt.Errorf("%w: periodic", ErrResync)
		case <-r.status:
			return fmt.Errorf("%w: reconnected", ErrResync)
		case e, ok := <-replay:
			if !ok {
				return fmt.Errorf("watch of %s closed", r.bucket)
			}
			if e == nil {
				if replayed {
					continue
				}
				replayed = true
				if !r.send(ctx, nil) {
					return nil
				}
				for _, m := range pending {
					if err := r.live(ctx, m, false); err != nil {
						return err
					}
				}
				pending = nil
				if r.msgs != nil {
					t := time.NewTimer(r.o.Settle)
					defer t.Stop()
					settle = t.C
				}
				continue
			}
			if !r.observe(ctx, e.Key(), e.Revision(), e.Operation() != jetstream.KeyValuePut, e) {
				return nil
			}
		case <-settle:
			// From here the subscription alone delivers, in stream order.
			_ = r.replay.Stop()
			r.replay, replay, settle, settled = nil, nil, nil, true
		case m := <-r.msgs:
			if !replayed {
				if pending = append(pending, m); len(pending) > maxPending {
					return fmt.Errorf("%w: %d changes while replaying", ErrResync, len(pending))
				}
				continue
			}
			if err := r.live(ctx, m, settled); err != nil {
				return err
			}
		}
	}
}

// observe delivers one change of key unless a newer one was delivered already; it reports
// false when ctx ended.
func (r *run) observe(ctx context.Context, key string, seq uint64, deleted bool, e jetstream.KeyValueEntry) bool {
	if seq <= r.known[key].seq {
		return true
	}
	r.known[key] = rev{seq: seq, deleted: deleted, created: e.Created()}
	return r.send(ctx, e)
}

func (r *run) send(ctx context.Context, e jetstream.KeyValueEntry) bool {
	select {
	case r.w.updates <- e:
		return true
	case <-ctx.Done():
		return false
	}
}

// live merges one republished change. Once settled, changes arrive in stream order and each
// must follow the last change seen of its key; while the replay consumer still delivers, the
// two sources interleave and only the newest value per key is kept.
func (r *run) live(ctx context.Context, m *nats.Msg, settled bool) error {
	if n, _ := r.sub.Dropped(); n > 0 {
		return fmt.Errorf("%w: %d changes dropped (slow consumer)", ErrResync, n)
	}
	subj := m.Header.Get(jetstream.SubjectHeader)
	key, ok := strings.CutPrefix(subj, r.prefix)
	seq, err1 := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	last, err2 := strconv.ParseUint(m.Header.Get(jetstream.LastSequenceHeader), 10, 64)
	if !ok || key == "" || err1 != nil || err2 != nil {
		// Only the server publishes here (agents may not): a message not shaped as a
		// republish means the feed cannot be trusted.
		return fmt.Errorf("%w: malformed change on %s", ErrResync, m.Subject)
	}
	// The subscription delivers in stream order; the replay consumer may have delivered newer
	// changes than those still waiting in the subscription's buffer, so order is checked
	// against the subscription's own past only.
	if seq <= r.liveMax {
		return fmt.Errorf("%w: sequence %d after %d (bucket %s recreated?)", ErrResync, seq, r.liveMax, r.bucket)
	}
	r.liveMax = seq
	created, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	k := r.known[key]
	if seq <= k.seq {
		if created.After(k.created) {
			// An older sequence written later than what was seen: the stream started over.
			return fmt.Errorf("%w: %s written again at sequence %d, after %d (bucket %s recreated?)", ErrResync, key, seq, k.seq, r.bucket)
		}
		return nil // the replay consumer delivered it, or a newer one, already
	}
	if settled && last != k.seq && !(last == 0 && k.deleted) {
		// last == 0 after a delete: the delete marker was purged since (rbac-sync purges
		// them), which is no loss.
		return fmt.Errorf("%w: change %d of %s follows %d, last seen %d", ErrResync, seq, key, last, k.seq)
	}
	op := jetstream.KeyValuePut
	switch m.Header.Get("KV-Operation") {
	case "DEL":
		op = jetstream.KeyValueDelete
	case "PURGE":
		op = jetstream.KeyValuePurge
	}
	e := &entry{bucket: r.bucket, key: key, value: m.Data, seq: seq, created: created, op: op}
	r.observe(ctx, key, seq, op != jetstream.KeyValuePut, e) // false only when ctx ended: loop sees it
	return nil
}

// entry is a jetstream.KeyValueEntry built from a republished message.
type entry struct {
	bucket, key string
	value       []byte
	seq         uint64
	created     time.Time
	op          jetstream.KeyValueOp
}

func (e *entry) Bucket() string                  { return e.bucket }
func (e *entry) Key() string                     { return e.key }
func (e *entry) Value() []byte                   { return e.value }
func (e *entry) Revision() uint64                { return e.seq }
func (e *entry) Created() time.Time              { return e.created }
func (e *entry) Delta() uint64                   { return 0 }
func (e *entry) Operation() jetstream.KeyValueOp { return e.op }
