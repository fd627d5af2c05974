package rbacsync

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/events"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// SnapshotsBucket holds AccessAt's snapshots: per stream it folds, the state at a stream
// sequence (chunks under <stream>.<seq>.c<i>) and an index of them (key index.<stream>).
const SnapshotsBucket = subjects.RBACAccessSnapshotsBucket

// SnapshotConfig says how often AccessAt's snapshots are taken and how many are kept.
type SnapshotConfig struct {
	// Every: a stream gets a new snapshot once it has this many events after its latest
	// (default 1000): AccessAt replays at most about that many events per stream.
	Every uint64
	// MaxAge: a stream with any event after its latest snapshot gets a new one at least this
	// often (default 1h), so a stream with retention limits keeps a snapshot of its state ahead
	// of what the limits remove.
	MaxAge time.Duration
	// Interval between checks (default 1m).
	Interval time.Duration
	// Keep is how many snapshots are kept per stream (default 48); the oldest go first, and so
	// do those whose next events the stream no longer holds.
	Keep int
	// Disabled takes no snapshots and makes AccessAt replay from sequence 1 (the reference the
	// snapshots are tested against).
	Disabled bool
}

// RegisterFlags adds the snapshot flags (rbac-sync, fleetd) to fs.
func (c *SnapshotConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.Uint64Var(&c.Every, "access-snapshot-every", 1000, "AccessAt: snapshot a stream once it has this many events after its latest snapshot")
	fs.DurationVar(&c.MaxAge, "access-snapshot-max-age", time.Hour, "AccessAt: snapshot a stream with any new event at least this often (keep streams' max-age well above it)")
	fs.IntVar(&c.Keep, "access-snapshots-kept", 48, "AccessAt: snapshots kept per stream (the oldest go first)")
}

func (c *SnapshotConfig) defaults() {
	if c.Every == 0 {
		c.Every = 1000
	}
	if c.MaxAge <= 0 {
		c.MaxAge = time.Hour
	}
	if c.Interval <= 0 {
		c.Interval = time.Minute
	}
	if c.Keep <= 0 {
		c.Keep = 48
	}
}

func snapshotsBucketConfig() jetstream.KeyValueConfig {
	return bucketConfig(SnapshotsBucket, "AccessAt's snapshots of the RBAC and namespace histories, with the stream sequences they cover.")
}

// snapshotHead describes one snapshot: the fold of its stream's events 1..Seq, whose latest
// stored time is MaxTime. It is the state at every moment from MaxTime until the next event.
type snapshotHead struct {
	Seq     uint64    `json:"seq"`
	MaxTime time.Time `json:"max_time"`
	Chunks  int       `json:"chunks"`
	Bytes   int       `json:"bytes"`
	Taken   time.Time `json:"taken"`
}

// snapshotChunk bounds one KV value well under NATS' default max payload (1 MiB).
const snapshotChunk = 256 << 10

func indexKey(stream string) string { return "index." + stream }

func chunkKey(stream string, seq uint64, i int) string {
	return fmt.Sprintf("%s.%020d.c%d", stream, seq, i)
}

// streamFold is how the events of one stream fold into a history, and how that part of a
// history is saved in a snapshot (as payloads of the stream's own event types) and loaded back.
type streamFold struct {
	stream string
	apply  func(h *history, ev *events.Event)
	save   func(h *history) []proto.Message
	load   func(h *history, m proto.Message) error
	// reset empties this stream's part of h.
	reset func(h *history)
}

func (s *Service) folds() (rbac, ns streamFold) {
	rbac = streamFold{
		stream: Stream,
		apply:  (*history).applyRBAC,
		reset:  func(h *history) { clear(h.templates); clear(h.bindings) },
		save: func(h *history) []proto.Message {
			var out []proto.Message
			for _, k := range slices.Sorted(maps.Keys(h.templates)) {
				out = append(out, &rbacv1.RoleTemplateCreated{Template: h.templates[k]})
			}
			for _, k := range slices.Sorted(maps.Keys(h.bindings)) {
				out = append(out, &rbacv1.ProjectRoleBound{Binding: h.bindings[k]}) // CreateTime is the bind event's
			}
			return out
		},
		load: func(h *history, m proto.Message) error {
			switch p := m.(type) {
			case *rbacv1.RoleTemplateCreated:
				h.templates[p.GetTemplate().GetName()] = p.GetTemplate()
			case *rbacv1.ProjectRoleBound:
				b := p.GetBinding()
				h.bindings[bindingKey(b.Project, b.Subject, b.RoleTemplate)] = b
			default:
				return fmt.Errorf("unexpected %T in an RBAC snapshot", m)
			}
			return nil
		},
	}
	ns = streamFold{
		stream: s.cfg.NamespaceStream,
		apply:  (*history).applyNamespace,
		reset:  func(h *history) { clear(h.places) },
		save: func(h *history) []proto.Message {
			var out []proto.Message
			for _, id := range slices.Sorted(maps.Keys(h.places)) {
				g := h.places[id]
				out = append(out, &projectv1.NamespaceBound{BindingId: id, Project: g.project, Cluster: g.place.cluster, Namespace: g.place.namespace})
			}
			return out
		},
		load: func(h *history, m proto.Message) error {
			p, ok := m.(*projectv1.NamespaceBound)
			if !ok {
				return fmt.Errorf("unexpected %T in a namespace snapshot", m)
			}
			h.places[p.GetBindingId()] = grantBinding{project: p.GetProject(), place: place{p.GetCluster(), p.GetNamespace()}}
			return nil
		},
	}
	return rbac, ns
}

func newHistory() *history {
	return &history{templates: map[string]*rbacv1.RoleTemplate{}, bindings: map[string]*rbacv1.ProjectRoleBinding{}, places: map[string]grantBinding{}}
}

// streamState is what a fold needs to know of its stream: whether it exists, and its first and
// last sequence.
type streamState struct {
	exists      bool
	first, last uint64
}

func (st streamState) complete() bool { return st.first <= 1 }

// usable says whether the events after h are all still in the stream.
func (st streamState) usable(h snapshotHead) bool { return st.complete() || h.Seq+1 >= st.first }

func (s *Service) streamState(ctx context.Context, stream string) (streamState, error) {
	js, err := s.js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return streamState{}, nil
	}
	if err != nil {
		return streamState{}, fmt.Errorf("stream %s: %w", stream, err)
	}
	info, err := js.Info(ctx)
	if err != nil {
		return streamState{}, fmt.Errorf("stream %s: %w", stream, err)
	}
	return streamState{exists: true, first: info.State.FirstSeq, last: info.State.LastSeq}, nil
}

func (s *Service) snapshotsKV(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := s.js.KeyValue(ctx, SnapshotsBucket)
	if err != nil {
		return nil, fmt.Errorf("snapshots bucket: %w", err)
	}
	return kv, nil
}

// readIndex returns stream's snapshots, oldest first, and the index's revision (0 if none).
func readIndex(ctx context.Context, kv jetstream.KeyValue, stream string) ([]snapshotHead, uint64, error) {
	e, err := kv.Get(ctx, indexKey(stream))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("snapshot index of %s: %w", stream, err)
	}
	var heads []snapshotHead
	if err := json.Unmarshal(e.Value(), &heads); err != nil {
		return nil, 0, fmt.Errorf("snapshot index of %s: %w", stream, err)
	}
	return heads, e.Revision(), nil
}

func loadSnapshot(ctx context.Context, kv jetstream.KeyValue, f streamFold, head snapshotHead, h *history) error {
	var data []byte
	for i := range head.Chunks {
		e, err := kv.Get(ctx, chunkKey(f.stream, head.Seq, i))
		if err != nil {
			return fmt.Errorf("snapshot %s@%d chunk %d: %w", f.stream, head.Seq, i, err)
		}
		data = append(data, e.Value()...)
	}
	if len(data) != head.Bytes {
		return fmt.Errorf("snapshot %s@%d: %d bytes, want %d", f.stream, head.Seq, len(data), head.Bytes)
	}
	r := bufio.NewReader(bytes.NewReader(data))
	for {
		a := &anypb.Any{}
		if err := protodelim.UnmarshalFrom(r, a); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("snapshot %s@%d: %w", f.stream, head.Seq, err)
		}
		m, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("snapshot %s@%d: %w", f.stream, head.Seq, err)
		}
		if err := f.load(h, m); err != nil {
			return fmt.Errorf("snapshot %s@%d: %w", f.stream, head.Seq, err)
		}
	}
}

func encodeSnapshot(msgs []proto.Message) ([]byte, error) {
	var buf bytes.Buffer
	for _, m := range msgs {
		a, err := anypb.New(m)
		if err != nil {
			return nil, err
		}
		if _, err := protodelim.MarshalTo(&buf, a); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// foldAt folds f's stream into h as it was at until: from the latest snapshot at or before
// until whose following events the stream still holds, then the events after it. When the
// stream's early events are gone and no snapshot covers until, it fails with
// FailedPrecondition naming the earliest time it can answer.
func (s *Service) foldAt(ctx context.Context, f streamFold, h *history, until time.Time) (uint64, error) {
	return s.fold(ctx, f, h, until, false)
}

func (s *Service) foldAtRetry(ctx context.Context, f streamFold, h *history, until time.Time) (uint64, error) {
	f.reset(h) // what the failed load put there
	return s.fold(ctx, f, h, until, true)
}

func (s *Service) fold(ctx context.Context, f streamFold, h *history, until time.Time, retried bool) (uint64, error) {
	var (
		heads []snapshotHead
		kv    jetstream.KeyValue
		err   error
	)
	if !s.cfg.Snapshots.Disabled {
		if kv, err = s.snapshotsKV(ctx); err != nil {
			return 0, apierr.Internal(err)
		}
		if heads, _, err = readIndex(ctx, kv, f.stream); err != nil {
			return 0, apierr.Internal(err)
		}
	}
	st, err := s.streamState(ctx, f.stream)
	if err != nil {
		return 0, apierr.Internal(err)
	}
	var prev folded
	for i := len(heads) - 1; i >= 0; i-- {
		hd := heads[i]
		if hd.MaxTime.After(until) || !st.usable(hd) {
			continue
		}
		if err := loadSnapshot(ctx, kv, f, hd, h); err != nil {
			if !errors.Is(err, jetstream.ErrKeyNotFound) || retried {
				return 0, apierr.Internal(err)
			}
			// Pruned since the index was read: read it again.
			return s.foldAtRetry(ctx, f, h, until)
		}
		prev = folded{seq: hd.Seq, maxTime: hd.MaxTime}
		break
	}
	got, err := replay(ctx, s.js, f.stream, prev, until, func(ev *events.Event) { f.apply(h, ev) })
	if errors.Is(err, errHistoryGone) {
		return 0, s.tooEarly(ctx, until)
	}
	if err != nil {
		return 0, apierr.Internal(err)
	}
	return got.seq, nil
}

// tooEarly is AccessAt's refusal of a time before what the streams and snapshots still cover.
func (s *Service) tooEarly(ctx context.Context, until time.Time) error {
	earliest, err := s.EarliestAccessTime(ctx)
	if err != nil {
		return apierr.Internal(err)
	}
	if earliest.IsZero() {
		return apierr.FailedPrecondition("access at %s: the events of that time were removed by the streams' retention and no snapshot covers it; "+
			"a new snapshot can cover only times after the stream's first remaining event, and none can be taken if no snapshot continues to it (docs/events.md, Retention)", until.UTC().Format(time.RFC3339Nano))
	}
	return apierr.FailedPrecondition("access at %s: the events of that time were removed by the streams' retention; "+
		"the earliest time AccessAt can answer is %s (docs/events.md, Retention)", until.UTC().Format(time.RFC3339Nano), earliest.UTC().Format(time.RFC3339Nano))
}

// EarliestAccessTime returns the earliest time AccessAt can answer for: the zero time when the
// streams still hold every event (any time), else the latest, over both streams, of the oldest
// snapshot whose following events the stream holds (the zero time too when there is none).
func (s *Service) EarliestAccessTime(ctx context.Context) (time.Time, error) {
	if s.cfg.Snapshots.Disabled {
		return time.Time{}, nil
	}
	kv, err := s.snapshotsKV(ctx)
	if err != nil {
		return time.Time{}, err
	}
	rbac, ns := s.folds()
	var earliest time.Time
	for _, f := range []streamFold{rbac, ns} {
		st, err := s.streamState(ctx, f.stream)
		if err != nil {
			return time.Time{}, err
		}
		if !st.exists || st.complete() {
			continue
		}
		heads, _, err := readIndex(ctx, kv, f.stream)
		if err != nil {
			return time.Time{}, err
		}
		i := slices.IndexFunc(heads, st.usable)
		if i < 0 {
			return time.Time{}, nil
		}
		if heads[i].MaxTime.After(earliest) {
			earliest = heads[i].MaxTime
		}
	}
	return earliest, nil
}

// historyAt is the state of templates, bindings and namespace ownership at until, and the
// sequences of the last events of each stream it includes.
func (s *Service) historyAt(ctx context.Context, until time.Time) (*history, uint64, uint64, error) {
	h := newHistory()
	rbac, ns := s.folds()
	rbacSeq, err := s.foldAt(ctx, rbac, h, until)
	if err != nil {
		return nil, 0, 0, err
	}
	nsSeq, err := s.foldAt(ctx, ns, h, until)
	if err != nil {
		return nil, 0, 0, err
	}
	return h, rbacSeq, nsSeq, nil
}

// TakeSnapshots takes a snapshot of each stream AccessAt folds that has enough new events (or
// old enough ones; see SnapshotConfig) and prunes the snapshots no longer wanted. The service
// runs it only while it holds SnapshotLease; should two run at once anyway, the index is updated
// with compare-and-set and the sweep spares chunks above the newest indexed sequence.
func (s *Service) TakeSnapshots(ctx context.Context) error {
	kv, err := s.snapshotsKV(ctx)
	if err != nil {
		return err
	}
	rbac, ns := s.folds()
	for _, f := range []streamFold{rbac, ns} {
		if err := s.snapshotStream(ctx, kv, f); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) snapshotStream(ctx context.Context, kv jetstream.KeyValue, f streamFold) error {
	cfg := s.cfg.Snapshots
	heads, rev, err := readIndex(ctx, kv, f.stream)
	if err != nil {
		return err
	}
	st, err := s.streamState(ctx, f.stream)
	if err != nil || !st.exists {
		return err
	}
	var latest snapshotHead
	if len(heads) > 0 {
		latest = heads[len(heads)-1]
	}
	due := st.last > latest.Seq && (st.last-latest.Seq >= cfg.Every || s.now().Sub(latest.Taken) >= cfg.MaxAge)
	if due {
		h := newHistory()
		var prev folded
		switch {
		case latest.Seq > 0 && st.usable(latest):
			if err := loadSnapshot(ctx, kv, f, latest, h); err != nil {
				return err
			}
			prev = folded{seq: latest.Seq, maxTime: latest.MaxTime}
		case !st.complete():
			return fmt.Errorf("snapshot of %s: the stream starts at %d and no snapshot covers the events before: %w", f.stream, st.first, errHistoryGone)
		}
		got, err := replay(ctx, s.js, f.stream, prev, time.Unix(1<<62, 0), func(ev *events.Event) { f.apply(h, ev) })
		if err != nil {
			return fmt.Errorf("snapshot of %s: %w", f.stream, err)
		}
		data, err := encodeSnapshot(f.save(h))
		if err != nil {
			return fmt.Errorf("snapshot of %s: %w", f.stream, err)
		}
		head := snapshotHead{Seq: got.seq, MaxTime: got.maxTime, Bytes: len(data), Taken: s.now()}
		for off := 0; ; off += snapshotChunk {
			if _, err := kv.Put(ctx, chunkKey(f.stream, head.Seq, head.Chunks), data[off:min(off+snapshotChunk, len(data))]); err != nil {
				return fmt.Errorf("snapshot of %s: %w", f.stream, err)
			}
			head.Chunks++
			if off+snapshotChunk >= len(data) {
				break
			}
		}
		heads = append(heads, head)
	}
	// Prune: snapshots the stream cannot continue from, then the oldest beyond Keep.
	var kept, dropped []snapshotHead
	for _, hd := range heads {
		if st.usable(hd) {
			kept = append(kept, hd)
		} else {
			dropped = append(dropped, hd)
		}
	}
	if n := len(kept) - cfg.Keep; n > 0 {
		dropped, kept = append(dropped, kept[:n]...), kept[n:]
	}
	if !due && len(dropped) == 0 {
		return nil
	}
	data, err := json.Marshal(kept)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = kv.Create(ctx, indexKey(f.stream), data)
	} else {
		_, err = kv.Update(ctx, indexKey(f.stream), data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		s.log.Debug("another replica updated the snapshot index first", zap.String("stream", f.stream))
		return nil
	}
	if err != nil {
		return fmt.Errorf("snapshot index of %s: %w", f.stream, err)
	}
	for _, hd := range dropped {
		for i := range hd.Chunks {
			if err := kv.Purge(ctx, chunkKey(f.stream, hd.Seq, i)); err != nil {
				return fmt.Errorf("prune snapshot %s@%d: %w", f.stream, hd.Seq, err)
			}
		}
	}
	return sweepChunks(ctx, kv, f.stream, kept)
}

// sweepChunks purges the chunks of stream up to the newest indexed sequence that no snapshot in
// kept names: those a snapshotter
// wrote and then could not index (it crashed, or lost the index's compare-and-set to a replica
// before the lease made snapshots single-writer). Only the snapshot lease's holder calls it, so
// no chunk being written for an index update still to come is swept.
func sweepChunks(ctx context.Context, kv jetstream.KeyValue, stream string, kept []snapshotHead) error {
	want := map[string]bool{}
	var newest uint64
	for _, hd := range kept {
		newest = max(newest, hd.Seq)
		for i := range hd.Chunks {
			want[chunkKey(stream, hd.Seq, i)] = true
		}
	}
	lister, err := kv.ListKeysFiltered(ctx, stream+".>")
	if err != nil {
		return fmt.Errorf("list snapshot chunks of %s: %w", stream, err)
	}
	// The lister stops its watcher once it has listed every key, or when ctx ends.
	var orphans []string
	for k := range lister.Keys() {
		// Only chunks at or below the newest indexed sequence: a snapshotter that could still
		// index its chunks (one that read this index, outside the lease: an older version in a
		// rolling upgrade, or a paused former holder) writes above it.
		var seq uint64
		if _, err := fmt.Sscanf(strings.TrimPrefix(k, stream+"."), "%d.c", &seq); err != nil || seq > newest {
			continue
		}
		if !want[k] {
			orphans = append(orphans, k)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, k := range orphans {
		if err := kv.Purge(ctx, k); err != nil {
			return fmt.Errorf("sweep snapshot chunk %s: %w", k, err)
		}
	}
	return nil
}

// SnapshotLease is held by the one replica that takes AccessAt's snapshots: replicas racing for
// the index would each write a snapshot's chunks and all but one would be left unindexed.
const SnapshotLease = "rbac-sync.snapshots"

// runSnapshots takes snapshots while this replica holds SnapshotLease.
func (s *Service) runSnapshots(ctx context.Context) error {
	return lease.Run(ctx, s.js, SnapshotLease, lease.DefaultHolder(), lease.DefaultTTL, s.snapshotLoop,
		lease.WithLogger(s.log), lease.WithReplicas(s.cfg.Replicas), lease.WithMetrics(s.leases))
}

// snapshotLoop takes snapshots every Interval until ctx is done. Failures are logged, not
// fatal: AccessAt still answers from older snapshots and the streams.
func (s *Service) snapshotLoop(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Snapshots.Interval)
	defer t.Stop()
	for {
		if err := s.TakeSnapshots(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("AccessAt snapshots", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
