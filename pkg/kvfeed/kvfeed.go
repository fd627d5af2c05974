// Package kvfeed watches the keys of a KV bucket under a filter, as jetstream.KeyValue.Watch
// does, without holding a JetStream consumer while it waits for changes.
//
// A KV watch is an ordered consumer per watcher. With one watcher per member cluster on each
// desired-state bucket, the hub held three consumers per cluster: nats-server refuses consumers
// past its per-stream limit (the 1,001st cluster got nothing), and every stored message was
// matched against every consumer's filter, so a change on N clusters cost N² (issue 26).
//
// A Watcher replays the filtered keys (the latest value of each key, deletes included; the
// replay ends with a nil entry, as a KV watch's does) and receives every later change from the
// bucket's republish (subjects.FeedRePublish) through a core NATS subscription made before the
// replay started. Each change carries its stream sequence and the sequence of the previous
// message of its key, so the merge of the two sources keeps the newest value per key, and a
// change whose predecessor was never seen shows that something was lost. The Watcher then ends
// with ErrResync, and the caller resumes it (Resume: a fresh replay on the same subscription):
//   - after a reconnect (core NATS delivers nothing while disconnected),
//   - when the subscription dropped messages (a slow consumer),
//   - when a key's previous sequence is not the one last seen (a lost change),
//   - when sequences go backwards (the bucket was deleted and created again),
//   - every Options.Resync (jittered), the safety net for what none of those can see: a change
//     republished by nobody while the stream's leader changed, or lost on a route while the
//     subscription's interest propagated through a NATS cluster.
//
// The replay costs the hub as little as it can, because after a hub restart every agent
// replays at once (the storm, docs/scale.md). A filter naming one key is replayed with a
// JetStream direct get of that key ($JS.API.DIRECT.GET.<stream>.<subject>: no consumer, and a
// subject NATS permissions can restrict to the agent's own key). A wildcard filter is replayed
// by a short-lived push consumer without flow control or heartbeats, which is left to expire
// (InactiveThreshold) rather than deleted: nats-server's deletion of a consumer with flow
// control unsubscribes its wildcard flow-control subjects, and every wildcard unsubscribe in
// the account walks the account's map of JetStream API requests awaiting a response
// ((*Account).checkForReverseEntries), thousands of them during a storm, so N replays cost N².
// For the same reason a resync keeps its wildcard feed subscription (Resume) instead of
// unsubscribing it and subscribing again, and asks nothing of the JetStream API but the
// consumer it needs.
//
// A bucket that does not republish to the feed (a hub older than its agents) is watched as
// before: an ordered consumer replays and stays to deliver the changes.
package kvfeed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// ErrResync ends a Watcher whose view may have missed a change: resume it for a fresh replay.
var ErrResync = errors.New("kvfeed: resync")

// Defaults for zero Options fields.
const (
	DefaultSettle = time.Second
	DefaultBuffer = 4096
	// maxPending bounds the live changes held while the replay runs; past it the replay is
	// abandoned (ErrResync) rather than the memory.
	maxPending = 100_000
	// flushTimeout bounds the wait for the server to confirm the subscription, setupTimeout
	// every request of a watch's setup.
	flushTimeout = 10 * time.Second
	setupTimeout = 10 * time.Second
	// replayTimeout bounds a replay consumer's delivery: it sends no heartbeats, so a message
	// lost on the way would otherwise stall the replay for good.
	replayTimeout = time.Minute
	// consumerInactive is how long a replay consumer outlives its subscription before the
	// server deletes it (nats-server adds up to a second).
	consumerInactive = 2 * time.Second
)

// Options tune a Watcher; the zero value is usable.
type Options struct {
	// Resync ends the Watcher with ErrResync after this long, ±25% so that a fleet of agents
	// started together does not replay together. 0 never does.
	Resync time.Duration
	// Settle keeps the replay's source this long after its replay, its changes merged with the
	// subscription's: in a NATS cluster the subscription's interest reaches the stream leader's
	// server asynchronously, and a change stored meanwhile reaches only the replay consumer (a
	// direct get is made again). Default DefaultSettle.
	Settle time.Duration
	// Buffer is the subscription's channel capacity; a change that finds it full is dropped
	// by the client and the Watcher resyncs. Default DefaultBuffer.
	Buffer int
}

func (o Options) withDefaults() Options {
	if o.Settle <= 0 {
		o.Settle = DefaultSettle
	}
	if o.Buffer <= 0 {
		o.Buffer = DefaultBuffer
	}
	return o
}

// Watcher delivers the replay of the filtered keys, a nil entry, then every change.
type Watcher struct {
	updates chan jetstream.KeyValueEntry
	cancel  context.CancelFunc
	done    chan struct{}
	err     error
	live    bool

	js     jetstream.JetStream
	bucket string
	filter string
	o      Options

	mu sync.Mutex
	// feed is the live subscription: kept when the Watcher ends by itself, for Resume to
	// take over, and released by Stop.
	feed *feed
}

// feed is a Watcher's core NATS subscription to the bucket's republished changes.
type feed struct {
	nc     *nats.Conn
	sub    *nats.Subscription
	msgs   chan *nats.Msg
	status chan nats.Status
}

func (f *feed) close() {
	_ = f.sub.Unsubscribe()
	f.nc.RemoveStatusListener(f.status)
}

// Watch starts watching the keys of bucket that match filter (a KV key filter such as
// "cluster.>" or one key).
func Watch(ctx context.Context, js jetstream.JetStream, bucket, filter string, o Options) (*Watcher, error) {
	o = o.withDefaults()
	// Every request of the setup is bounded: a request lost while the connection reconnects
	// is otherwise waited for as long as ctx lives (an agent's: forever), and the watch with it.
	sctx, scancel := context.WithTimeout(ctx, setupTimeout)
	defer scancel()
	str, err := js.Stream(sctx, "KV_"+bucket)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		err = jetstream.ErrBucketNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	if !reflect.DeepEqual(str.CachedInfo().Config.RePublish, subjects.FeedRePublish(bucket)) {
		return watchConsumer(ctx, js, bucket, filter, o)
	}
	nc := js.Conn()
	f := &feed{nc: nc, msgs: make(chan *nats.Msg, o.Buffer)}
	subj := subjects.FeedSubject(bucket, filter)
	// Subscribed, and the subscription known to the server, before the replay starts, so
	// that every change after the replay's snapshot reaches one of the two.
	if f.sub, err = nc.ChanSubscribe(subj, f.msgs); err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", subj, err)
	}
	fctx, fcancel := context.WithTimeout(ctx, flushTimeout)
	err = nc.FlushWithContext(fctx)
	fcancel()
	if err != nil {
		_ = f.sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe to %s: %w", subj, err)
	}
	f.status = nc.StatusChanged(nats.CONNECTED)
	return startLive(ctx, js, bucket, filter, o, f), nil
}

// Resume returns a Watcher with a fresh replay in place of w, which has ended (its Updates
// closed) or is stopped by it. A live Watcher's subscription is taken over, so that a resync
// neither unsubscribes nor subscribes again; otherwise (w was stopped, or follows a bucket
// without republish) it watches anew.
func (w *Watcher) Resume(ctx context.Context) (*Watcher, error) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	f := w.feed
	w.feed = nil
	w.mu.Unlock()
	if f == nil {
		return Watch(ctx, w.js, w.bucket, w.filter, w.o)
	}
	return startLive(ctx, w.js, w.bucket, w.filter, w.o, f), nil
}

// startLive starts a Watcher on the live subscription f; its replay runs in the background.
func startLive(ctx context.Context, js jetstream.JetStream, bucket, filter string, o Options, f *feed) *Watcher {
	wctx, cancel := context.WithCancel(ctx)
	w := &Watcher{
		updates: make(chan jetstream.KeyValueEntry, 256),
		cancel:  cancel,
		done:    make(chan struct{}),
		live:    true,
		js:      js, bucket: bucket, filter: filter, o: o,
		feed: f,
	}
	// A reconnect before this replay started is covered by it.
	for drained := false; !drained; {
		select {
		case <-f.status:
		default:
			drained = true
		}
	}
	r := &run{w: w, bucket: bucket, prefix: "$KV." + bucket + ".", o: o, known: map[string]rev{},
		nc: f.nc, sub: f.sub, msgs: f.msgs, status: f.status}
	// Only drops from here on can have lost a change: earlier ones are in the replay.
	r.dropped0, _ = f.sub.Dropped()
	replay := make(chan item, 64)
	if strings.ContainsAny(filter, "*>") {
		go consumerReplay(wctx, f.nc, bucket, filter, o, replay)
	} else {
		go directReplay(wctx, f.nc, bucket, filter, o, replay)
	}
	go func() {
		defer close(w.done)
		defer close(w.updates)
		w.err = r.loop(wctx, replay)
		stopped := wctx.Err() != nil || w.err == nil
		cancel() // ends the replay source
		if stopped {
			// Stopped (or its context ended): nobody resumes it.
			w.mu.Lock()
			if w.feed != nil {
				w.feed.close()
				w.feed = nil
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// watchConsumer watches a bucket that does not republish: an ordered consumer replays and then
// delivers the changes.
func watchConsumer(ctx context.Context, js jetstream.JetStream, bucket, filter string, o Options) (*Watcher, error) {
	sctx, scancel := context.WithTimeout(ctx, setupTimeout)
	defer scancel()
	kv, err := js.KeyValue(sctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &Watcher{
		updates: make(chan jetstream.KeyValueEntry, 256),
		cancel:  cancel,
		done:    make(chan struct{}),
		js:      js, bucket: bucket, filter: filter, o: o,
	}
	kw, err := startKVWatch(wctx, cancel, kv, filter)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch %s %s: %w", bucket, filter, err)
	}
	replay := make(chan item, 64)
	go func() {
		defer close(replay)
		defer func() { _ = kw.Stop() }()
		for {
			select {
			case <-wctx.Done():
				return
			case e, ok := <-kw.Updates():
				if !ok {
					return
				}
				if !sendItem(wctx, replay, item{e: e, end: e == nil}) {
					return
				}
			}
		}
	}()
	r := &run{w: w, bucket: bucket, prefix: "$KV." + bucket + ".", o: o, known: map[string]rev{}}
	go func() {
		defer close(w.done)
		defer close(w.updates)
		w.err = r.loop(wctx, replay)
		cancel() // ends the consumer
	}()
	return w, nil
}

// startKVWatch starts an ordered consumer within setupTimeout. The consumer lives as long as
// wctx, which also bounds the request creating it: on timeout, cancel ends that request.
func startKVWatch(wctx context.Context, cancel context.CancelFunc, kv jetstream.KeyValue, filter string) (jetstream.KeyWatcher, error) {
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

// item is what a replay source delivers: an entry, the end of the replay, or why it failed.
// A source closes its channel once it has settled (live Watchers) and delivers nothing more.
type item struct {
	e   jetstream.KeyValueEntry
	end bool
	err error
}

func sendItem(ctx context.Context, out chan<- item, it item) bool {
	select {
	case out <- it:
		return true
	case <-ctx.Done():
		return false
	}
}

// directReplay replays the one key filter names with a direct get, and gets it again after
// o.Settle for a change the subscription's interest may not have reached yet.
func directReplay(ctx context.Context, nc *nats.Conn, bucket, key string, o Options, out chan<- item) {
	defer close(out)
	subj := "$JS.API.DIRECT.GET.KV_" + bucket + ".$KV." + bucket + "." + key
	get := func() (jetstream.KeyValueEntry, error) {
		rctx, cancel := context.WithTimeout(ctx, setupTimeout)
		defer cancel()
		m, err := nc.RequestWithContext(rctx, subj, nil)
		if err != nil {
			return nil, fmt.Errorf("get %s of %s: %w", key, bucket, err)
		}
		switch m.Header.Get("Status") {
		case "":
		case "404":
			return nil, nil
		default:
			return nil, fmt.Errorf("get %s of %s: %s %s", key, bucket, m.Header.Get("Status"), m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("get %s of %s: sequence %q", key, bucket, m.Header.Get(jetstream.SequenceHeader))
		}
		created, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
		return &entry{bucket: bucket, key: key, value: m.Data, seq: seq, created: created, op: kvOp(m.Header)}, nil
	}
	e, err := get()
	if err != nil {
		sendItem(ctx, out, item{err: err})
		return
	}
	if e != nil && !sendItem(ctx, out, item{e: e}) {
		return
	}
	if !sendItem(ctx, out, item{end: true}) {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(o.Settle):
	}
	if e, err = get(); err != nil {
		sendItem(ctx, out, item{err: err})
		return
	}
	if e != nil {
		sendItem(ctx, out, item{e: e})
	}
}

// consumerRequest is the JetStream API's consumer create request.
type consumerRequest struct {
	Stream string         `json:"stream_name"`
	Config consumerConfig `json:"config"`
	Action string         `json:"action"`
}

type consumerConfig struct {
	Name              string        `json:"name"`
	DeliverSubject    string        `json:"deliver_subject"`
	DeliverPolicy     string        `json:"deliver_policy"`
	AckPolicy         string        `json:"ack_policy"`
	ReplayPolicy      string        `json:"replay_policy"`
	FilterSubject     string        `json:"filter_subject"`
	InactiveThreshold time.Duration `json:"inactive_threshold"`
	Replicas          int           `json:"num_replicas"`
	MemoryStorage     bool          `json:"mem_storage"`
}

type consumerResponse struct {
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
	NumPending uint64 `json:"num_pending"`
}

// consumerReplay replays the keys filter matches with a push consumer delivering the last
// message of each (no flow control, no heartbeats, no acks: see the package comment), merged
// for o.Settle after the replay, then left to expire.
func consumerReplay(ctx context.Context, nc *nats.Conn, bucket, filter string, o Options, out chan<- item) {
	defer close(out)
	fail := func(err error) { sendItem(ctx, out, item{err: err}) }
	stream, subject := "KV_"+bucket, "$KV."+bucket+"."+filter
	inbox := nc.NewInbox()
	// The consumer has no flow control, so the server pushes the whole replay at wire speed,
	// faster than the agent applies it: a channel of o.Buffer would overflow on a cluster with
	// more keys than that, and the replay would never complete. The replay is the cluster's own
	// keys, which the agent holds anyway: it is queued whole.
	q := newMsgQueue()
	sub, err := nc.Subscribe(inbox, q.push)
	if err != nil {
		fail(fmt.Errorf("subscribe to the replay of %s: %w", bucket, err))
		return
	}
	// A literal subject: unsubscribing it costs nats-server a map lookup.
	defer func() { _ = sub.Unsubscribe() }()
	// The inbox's last token is unique (a NUID): the consumer's name too.
	name := inbox[strings.LastIndexByte(inbox, '.')+1:]
	req, _ := json.Marshal(consumerRequest{Stream: stream, Action: "create", Config: consumerConfig{
		Name: name, DeliverSubject: inbox, DeliverPolicy: "last_per_subject", AckPolicy: "none",
		ReplayPolicy: "instant", FilterSubject: subject, InactiveThreshold: consumerInactive,
		Replicas: 1, MemoryStorage: true,
	}})
	rctx, cancel := context.WithTimeout(ctx, setupTimeout)
	resp, err := nc.RequestWithContext(rctx, "$JS.API.CONSUMER.CREATE."+stream+"."+name+"."+subject, req)
	cancel()
	if err != nil {
		fail(fmt.Errorf("create the replay consumer of %s: %w", bucket, err))
		return
	}
	var cr consumerResponse
	if err := json.Unmarshal(resp.Data, &cr); err != nil {
		fail(fmt.Errorf("create the replay consumer of %s: %w", bucket, err))
		return
	}
	if cr.Error != nil {
		err := fmt.Errorf("create the replay consumer of %s: %s (%d)", bucket, cr.Error.Description, cr.Error.ErrCode)
		if cr.Error.ErrCode == 10059 { // stream not found
			err = fmt.Errorf("%w: %w", jetstream.ErrBucketNotFound, err)
		}
		fail(err)
		return
	}
	ended := cr.NumPending == 0
	if ended && !sendItem(ctx, out, item{end: true}) {
		return
	}
	var (
		deadline = time.NewTimer(replayTimeout)
		settle   <-chan time.Time
		cseq     uint64
	)
	defer deadline.Stop()
	if ended {
		settle = time.After(o.Settle)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-settle:
			return
		case <-deadline.C:
			if !ended {
				fail(fmt.Errorf("%w: the replay of %s stalled", ErrResync, bucket))
				return
			}
		case <-q.ready:
		}
		for _, m := range q.drain() {
			if n, _ := sub.Dropped(); n > 0 {
				fail(fmt.Errorf("%w: %d replayed messages dropped (slow consumer)", ErrResync, n))
				return
			}
			meta, err := m.Metadata()
			if err != nil {
				fail(fmt.Errorf("%w: malformed replay message of %s: %w", ErrResync, bucket, err))
				return
			}
			if meta.Sequence.Consumer != cseq+1 {
				fail(fmt.Errorf("%w: replay message %d of %s after %d", ErrResync, meta.Sequence.Consumer, bucket, cseq))
				return
			}
			cseq = meta.Sequence.Consumer
			// Stalled means no progress for replayTimeout, not a replay longer than that: a
			// large one applied slowly is still moving.
			deadline.Reset(replayTimeout)
			key, ok := strings.CutPrefix(m.Subject, "$KV."+bucket+".")
			if !ok {
				fail(fmt.Errorf("%w: replay message on %s", ErrResync, m.Subject))
				return
			}
			e := &entry{bucket: bucket, key: key, value: m.Data, seq: meta.Sequence.Stream, created: meta.Timestamp, op: kvOp(m.Header)}
			if !sendItem(ctx, out, item{e: e}) {
				return
			}
			if !ended && meta.NumPending == 0 {
				ended = true
				if !sendItem(ctx, out, item{end: true}) {
					return
				}
				settle = time.After(o.Settle)
			}
		}
	}
}

// msgQueue is an unbounded queue of messages filled by a subscription's callback: ready has a
// token whenever the queue may hold messages.
type msgQueue struct {
	mu    sync.Mutex
	msgs  []*nats.Msg
	ready chan struct{}
}

func newMsgQueue() *msgQueue { return &msgQueue{ready: make(chan struct{}, 1)} }

func (q *msgQueue) push(m *nats.Msg) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// drain returns every queued message, oldest first, and empties the queue.
func (q *msgQueue) drain() []*nats.Msg {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.msgs
	q.msgs = nil
	return out
}

func kvOp(h nats.Header) jetstream.KeyValueOp {
	switch h.Get("KV-Operation") {
	case "DEL":
		return jetstream.KeyValueDelete
	case "PURGE":
		return jetstream.KeyValuePurge
	}
	return jetstream.KeyValuePut
}

// Updates delivers the replay, nil once it is complete, then every change. It is closed when
// the Watcher ends; Err then says why.
func (w *Watcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }

// Err is why Updates was closed: nil after Stop or the end of the context, ErrResync (wrapped
// with the reason) when the caller should resume at once, another error otherwise (resume
// after a backoff). Read it only after Updates is closed.
func (w *Watcher) Err() error { return w.err }

// Live reports whether changes come from the bucket's republish (false: from a consumer, the
// bucket does not republish to the feed).
func (w *Watcher) Live() bool { return w.live }

// Stop ends the Watcher and releases its subscription, unless Resume took it over.
func (w *Watcher) Stop() error {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.feed != nil {
		w.feed.close()
		w.feed = nil
	}
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
	known  map[string]rev
	// dropped0 is what the subscription had dropped when this run started.
	dropped0 int
	// liveMax is the last sequence the subscription delivered.
	liveMax uint64
}

func (r *run) loop(ctx context.Context, replay <-chan item) error {
	var resync <-chan time.Time
	if r.o.Resync > 0 {
		d := r.o.Resync*3/4 + rand.N(r.o.Resync/2+1)
		t := time.NewTimer(d)
		defer t.Stop()
		resync = t.C
	}
	var (
		replayed bool
		settled  bool
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
		case it, ok := <-replay:
			if ctx.Err() != nil {
				return nil
			}
			if !ok {
				if r.msgs == nil || !replayed {
					return fmt.Errorf("watch of %s closed", r.bucket)
				}
				// From here the subscription alone delivers, in stream order.
				replay, settled = nil, true
				continue
			}
			if it.err != nil {
				return it.err
			}
			if it.end {
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
				continue
			}
			e := it.e
			if !r.observe(ctx, e.Key(), e.Revision(), e.Operation() != jetstream.KeyValuePut, e) {
				return nil
			}
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
// must follow the last change seen of its key; while the replay source still delivers, the
// two sources interleave and only the newest value per key is kept.
func (r *run) live(ctx context.Context, m *nats.Msg, settled bool) error {
	if n, _ := r.sub.Dropped(); n > r.dropped0 {
		return fmt.Errorf("%w: %d changes dropped (slow consumer)", ErrResync, n-r.dropped0)
	}
	subj := m.Header.Get(jetstream.SubjectHeader)
	key, ok := strings.CutPrefix(subj, r.prefix)
	seq, err1 := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	last, err2 := strconv.ParseUint(m.Header.Get(jetstream.LastSequenceHeader), 10, 64)
	if !ok || key == "" || err1 != nil || err2 != nil {
		// Not a republish, so not the server's: ignored. Agents may not publish here, but an
		// agent can point a push consumer of its own keys at another cluster's feed subject
		// (the deliver subject is in the request body, which permissions cannot see); were
		// that a reason to resync, any agent could keep every other replaying.
		return nil
	}
	// The subscription delivers in stream order; the replay source may have delivered newer
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
		return nil // the replay delivered it, or a newer one, already
	}
	if settled && last != k.seq && !(last == 0 && k.deleted) {
		// last == 0 after a delete: the delete marker was purged since (rbac-sync purges
		// them), which is no loss.
		return fmt.Errorf("%w: change %d of %s follows %d, last seen %d", ErrResync, seq, key, last, k.seq)
	}
	e := &entry{bucket: r.bucket, key: key, value: m.Data, seq: seq, created: created, op: kvOp(m.Header)}
	r.observe(ctx, key, seq, e.op != jetstream.KeyValuePut, e) // false only when ctx ended: loop sees it
	return nil
}

// entry is a jetstream.KeyValueEntry built from a republished or replayed message.
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
