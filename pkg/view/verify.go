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

// Verify rebuilds p in memory from its stream, up to the checkpoint its bucket records, and
// compares the result with every entry of the bucket: the proof that a view equals a rebuild
// from the streams (the chaos suite runs it after every fault). It reads only (an ordered
// consumer on the stream and a watch of the bucket), so it may run beside the live engines with
// the service's own NATS credentials. While events keep arriving the checkpoint moves under the
// comparison; Verify then tries again, until ctx ends.
func Verify(ctx context.Context, js jetstream.JetStream, p Projection) (Verification, error) {
	fd, err := revisionField(p.New())
	if err != nil {
		return Verification{}, err
	}
	for {
		v, stable, err := verifyOnce(ctx, js, p, fd)
		if err != nil || stable {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, fmt.Errorf("verify view %s: the checkpoint kept moving: %w", p.Name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func verifyOnce(ctx context.Context, js jetstream.JetStream, p Projection, fd protoreflect.FieldDescriptor) (Verification, bool, error) {
	v := Verification{View: p.Name}
	kv, err := js.KeyValue(ctx, p.Bucket.Bucket)
	if err != nil {
		return v, false, fmt.Errorf("verify view %s: bucket: %w", p.Name, err)
	}
	before, err := readMeta(ctx, kv)
	if err != nil {
		return v, false, fmt.Errorf("verify view %s: %w", p.Name, err)
	}
	if before.Version != p.Version {
		return v, false, fmt.Errorf("verify view %s: the bucket holds version %d, the projection is version %d", p.Name, before.Version, p.Version)
	}
	v.Checkpoint = before.Checkpoint
	want, err := fold(ctx, js, p, fd, before.Checkpoint)
	if err != nil {
		return v, false, fmt.Errorf("verify view %s: %w", p.Name, err)
	}
	got, err := readEntries(ctx, kv, p)
	if err != nil {
		return v, false, fmt.Errorf("verify view %s: %w", p.Name, err)
	}
	after, err := readMeta(ctx, kv)
	if err != nil {
		return v, false, fmt.Errorf("verify view %s: %w", p.Name, err)
	}
	if after.Checkpoint != before.Checkpoint {
		return v, false, nil
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
	return v, true, nil
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
// does (an event the projection refuses is skipped: the engine dead-letters it).
func fold(ctx context.Context, js jetstream.JetStream, p Projection, fd protoreflect.FieldDescriptor, upTo uint64) (map[string]proto.Message, error) {
	entries := map[string]proto.Message{}
	if upTo == 0 {
		return entries, nil
	}
	cons, err := js.OrderedConsumer(ctx, p.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: p.Subjects})
	if err != nil {
		return nil, fmt.Errorf("consumer on %s: %w", p.Stream, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", p.Stream, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("read %s: %w", p.Stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("read %s: metadata: %w", p.Stream, err)
		}
		seq := md.Sequence.Stream
		if seq > upTo {
			return entries, nil
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
		if seq == upTo || md.NumPending == 0 {
			return entries, nil
		}
	}
}

func readEntries(ctx context.Context, kv jetstream.KeyValue, p Projection) (map[string]proto.Message, error) {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read bucket: %w", err)
	}
	defer func() { _ = w.Stop() }()
	entries := map[string]proto.Message{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("read bucket: watch closed")
			}
			if e == nil {
				return entries, nil // initial values done
			}
			if e.Key() == MetaKey {
				continue
			}
			m := p.New()
			if err := proto.Unmarshal(e.Value(), m); err != nil {
				return nil, fmt.Errorf("read bucket: decode %s: %w", e.Key(), err)
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
