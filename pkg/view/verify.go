package view

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/fleetstream/fleetstream/pkg/events"
)

// Mismatch is one key where a view's bucket and a rebuild of it from the stream disagree. An
// empty Want means the rebuild has no such entry; an empty Got, the bucket has none.
type Mismatch struct {
	Key       string
	Want, Got string
}

// Verification is what Verify found.
type Verification struct {
	View string
	// Checkpoint is the stream sequence the bucket and the rebuild were compared at.
	Checkpoint uint64
	// Entries is the number of entries of the rebuild.
	Entries    int
	Mismatches []Mismatch
}

// Equal reports whether the bucket equals the rebuild.
func (v Verification) Equal() bool { return len(v.Mismatches) == 0 }

// ErrNotStable means Verify found no moment at which the bucket and its stream could be
// compared: the checkpoint kept moving, or (on a stream keeping the latest messages per
// subject) the engine kept lagging the stream, for every attempt it made.
var ErrNotStable = errors.New("view not stable")

// VerifyOption tunes Verify.
type VerifyOption func(*verifyOptions)

type verifyOptions struct {
	attempts int
	pause    time.Duration
}

// VerifyAttempts bounds how many times Verify compares before it gives up with ErrNotStable,
// and how long it pauses between attempts (default 100 attempts, 200 ms apart).
func VerifyAttempts(n int, pause time.Duration) VerifyOption {
	return func(o *verifyOptions) { o.attempts, o.pause = max(n, 1), pause }
}

// Verify rebuilds p in memory from its stream, up to the checkpoint its bucket records, and
// compares the result with every entry of the bucket: the proof that a view equals a rebuild
// from the streams (the chaos suite runs it after every fault). It reads only (an ordered
// consumer on the stream and a watch of the bucket), so it may run beside the live engines with
// the service's own NATS credentials.
//
// An attempt can be unfit for comparing: when the checkpoint moved under it, or when the stream
// keeps only the latest messages per subject (FLEET_AGENT) and holds messages of the view's
// subjects past the checkpoint. Such a message may have removed one at or below the checkpoint
// that the engine applied, so the rebuild would lack what the correct but lagging bucket has;
// which keys that message changed cannot be known once it is gone, so no key can be singled
// out as unknown. Verify then tries again, until the engine has caught up, for a bounded number
// of attempts (VerifyAttempts) and at most until ctx ends; it fails with ErrNotStable after.
func Verify(ctx context.Context, js jetstream.JetStream, p Projection, opts ...VerifyOption) (Verification, error) {
	o := verifyOptions{attempts: 100, pause: 200 * time.Millisecond}
	for _, opt := range opts {
		opt(&o)
	}
	fd, err := revisionField(p.New())
	if err != nil {
		return Verification{}, err
	}
	stream, err := js.Stream(ctx, p.Stream)
	if err != nil {
		return Verification{}, fmt.Errorf("verify view %s: stream %s: %w", p.Name, p.Stream, err)
	}
	// A stream with a per-subject limit drops a message when a newer one of its subject arrives
	// (pkg/view's checkHistory exempts it for that reason).
	latestOnly := stream.CachedInfo().Config.MaxMsgsPerSubject > 0
	var why string
	// Entries newer than the checkpoint are a batch being written while the engine moves, but a
	// write by something else (corruption, the very thing to catch) while it does not: once the
	// checkpoint has stayed at the same KV revision for aheadPatience attempts, compare anyway.
	const aheadPatience = 5
	var aheadRev uint64
	aheadSeen := 0
	for attempt := 1; ; attempt++ {
		v, unfit, rev, err := verifyOnce(ctx, js, p, fd, latestOnly, aheadSeen >= aheadPatience)
		if err != nil || unfit == "" {
			return v, err
		}
		switch {
		case rev == 0:
			aheadRev, aheadSeen = 0, 0
		case rev == aheadRev:
			aheadSeen++
		default:
			aheadRev, aheadSeen = rev, 1
		}
		why = unfit
		if attempt >= o.attempts {
			return v, fmt.Errorf("verify view %s: %w after %d attempts: %s", p.Name, ErrNotStable, attempt, why)
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("verify view %s: %w: %s: %w", p.Name, ErrNotStable, why, ctx.Err())
		case <-time.After(o.pause):
		}
	}
}

// verifyOnce compares the bucket with a rebuild once. unfit is empty when it did; otherwise it
// says why this attempt could not compare (nothing in v is meaningful then).
//
// aheadRev is the checkpoint's KV revision when the attempt was unfit only because entries
// newer than it were in the bucket (0 otherwise); tolerateAhead compares then anyway.
func verifyOnce(ctx context.Context, js jetstream.JetStream, p Projection, fd protoreflect.FieldDescriptor, latestOnly, tolerateAhead bool) (v Verification, unfit string, aheadRev uint64, err error) {
	v = Verification{View: p.Name}
	kv, err := js.KeyValue(ctx, p.Bucket.Bucket)
	if err != nil {
		return v, "", 0, fmt.Errorf("verify view %s: bucket: %w", p.Name, err)
	}
	before, err := readMeta(ctx, kv)
	if err != nil {
		return v, "", 0, fmt.Errorf("verify view %s: %w", p.Name, err)
	}
	if before.Version != p.Version {
		return v, "", 0, fmt.Errorf("verify view %s: the bucket holds version %d, the projection is version %d", p.Name, before.Version, p.Version)
	}
	v.Checkpoint = before.Checkpoint
	want, beyond, err := fold(ctx, js, p, fd, before.Checkpoint)
	if err != nil {
		return v, "", 0, fmt.Errorf("verify view %s: %w", p.Name, err)
	}
	got, metaRev, ahead, err := readEntries(ctx, kv, p)
	if err != nil {
		return v, "", 0, fmt.Errorf("verify view %s: %w", p.Name, err)
	}
	after, err := readMeta(ctx, kv)
	if err != nil {
		return v, "", 0, fmt.Errorf("verify view %s: %w", p.Name, err)
	}
	if after.Checkpoint != before.Checkpoint {
		return v, fmt.Sprintf("the checkpoint moved from %d to %d during the comparison", before.Checkpoint, after.Checkpoint), 0, nil
	}
	if ahead && !tolerateAhead {
		// The engine writes a batch's entries, then its checkpoint: entries newer than the
		// checkpoint the bucket holds are the next batch's, caught half-written.
		return v, fmt.Sprintf("entries past checkpoint %d were being written", before.Checkpoint), metaRev, nil
	}
	if latestOnly && beyond {
		return v, fmt.Sprintf("stream %s keeps the latest message per subject and holds messages of the view past its checkpoint %d (the engine lags)", p.Stream, before.Checkpoint), 0, nil
	}
	v.Entries = len(want)
	keys := make(map[string]struct{}, len(want)+len(got))
	for k := range want {
		keys[k] = struct{}{}
	}
	for k := range got {
		keys[k] = struct{}{}
	}
	for k := range keys {
		w, g := want[k], got[k]
		if w != nil && g != nil && proto.Equal(w, g) {
			continue
		}
		v.Mismatches = append(v.Mismatches, Mismatch{Key: k, Want: text(w), Got: text(g)})
	}
	sort.Slice(v.Mismatches, func(i, j int) bool { return v.Mismatches[i].Key < v.Mismatches[j].Key })
	return v, "", 0, nil
}

func readMeta(ctx context.Context, kv jetstream.KeyValue) (meta, error) {
	var m meta
	e, err := kv.Get(ctx, MetaKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return m, nil
	}
	if err != nil {
		return m, fmt.Errorf("read checkpoint: %w", err)
	}
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return m, fmt.Errorf("decode checkpoint: %w", err)
	}
	return m, nil
}

// fold applies the stream's events up to and including seq upTo to an empty view, as the engine
// does (an event the projection refuses is skipped: the engine dead-letters it). beyond reports
// whether the stream held messages of the view's subjects past upTo while fold read it.
func fold(ctx context.Context, js jetstream.JetStream, p Projection, fd protoreflect.FieldDescriptor, upTo uint64) (entries map[string]proto.Message, beyond bool, err error) {
	entries = map[string]proto.Message{}
	cons, err := js.OrderedConsumer(ctx, p.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: p.Subjects})
	if err != nil {
		return nil, false, fmt.Errorf("consumer on %s: %w", p.Stream, err)
	}
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return entries, false, nil // nothing to read: Next would wait until ctx ends
	}
	if upTo == 0 {
		return entries, true, nil
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return nil, false, fmt.Errorf("consume %s: %w", p.Stream, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			return nil, false, fmt.Errorf("read %s: %w", p.Stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, false, fmt.Errorf("read %s: metadata: %w", p.Stream, err)
		}
		seq := md.Sequence.Stream
		if seq > upTo {
			return entries, true, nil
		}
		if ev, err := events.DecodeMsg(m); err == nil {
			if changes, err := p.Apply(ev); err == nil {
				for _, ch := range changes {
					var cur proto.Message
					if c, ok := entries[ch.Key]; ok {
						cur = c
					}
					next := ch.Update(cur)
					if next == nil {
						delete(entries, ch.Key)
						continue
					}
					next.ProtoReflect().Set(fd, protoreflect.ValueOfUint64(seq))
					entries[ch.Key] = next
				}
			}
		}
		// NumPending counts the filtered messages after this one when it was delivered: a
		// message that superseded one fold did not get to read was stored before then.
		if md.NumPending == 0 {
			return entries, false, nil
		}
		if seq == upTo {
			return entries, true, nil
		}
	}
}

// readEntries returns the bucket's entries (without MetaKey), MetaKey's KV revision, and whether
// any entry, a deletion included, was written after MetaKey was last: the engine was writing the
// next batch.
func readEntries(ctx context.Context, kv jetstream.KeyValue, p Projection) (map[string]proto.Message, uint64, bool, error) {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, 0, false, fmt.Errorf("read bucket: %w", err)
	}
	defer func() { _ = w.Stop() }()
	entries := map[string]proto.Message{}
	var metaRev, newest uint64
	for {
		select {
		case <-ctx.Done():
			return nil, 0, false, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, 0, false, errors.New("read bucket: watch closed")
			}
			if e == nil {
				return entries, metaRev, newest > metaRev, nil // initial values done
			}
			if e.Key() == MetaKey {
				metaRev = e.Revision()
				continue
			}
			newest = max(newest, e.Revision())
			if e.Operation() != jetstream.KeyValuePut {
				continue
			}
			m := p.New()
			if err := proto.Unmarshal(e.Value(), m); err != nil {
				return nil, 0, false, fmt.Errorf("read bucket: decode %s: %w", e.Key(), err)
			}
			entries[e.Key()] = m
		}
	}
}

func text(m proto.Message) string {
	if m == nil {
		return ""
	}
	return prototext.MarshalOptions{}.Format(m)
}
