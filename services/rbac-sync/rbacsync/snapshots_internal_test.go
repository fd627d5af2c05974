package rbacsync

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// randomHistory appends n random template, binding and namespace-binding events to FLEET_RBAC
// and FLEET_NS and calls between(i) after each; it returns the times it sampled (some right
// after an event, some between events) for AccessAt to be asked about.
func randomHistory(t testing.TB, js jetstream.JetStream, rng *rand.Rand, n int, between func(i int)) []time.Time {
	t.Helper()
	ctx := testkit.Context(t, 60*time.Second)
	rbacStore, nsStore := events.NewStore(js, actor), events.NewStore(js, "system:namespace-binding")
	templates := []string{"viewer", "editor", "admin", "auditor"}
	projects := []string{"team-a", "team-b", "team-c"}
	users := []string{"alice", "bob", "carol"}
	times := []time.Time{time.Now().Add(-time.Hour)}
	for i := range n {
		var err error
		switch r := rng.IntN(100); {
		case r < 20:
			tpl := &rbacv1.RoleTemplate{Name: templates[rng.IntN(len(templates))], DisplayName: fmt.Sprint(i),
				Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get"}, Resources: []string{fmt.Sprint("r", rng.IntN(3))}}}}
			if rng.IntN(2) == 0 {
				_, err = rbacStore.Append(ctx, SubjectPrefix+".template."+tpl.Name, tpl.Name, events.Any, &rbacv1.RoleTemplateCreated{Template: tpl})
			} else {
				_, err = rbacStore.Append(ctx, SubjectPrefix+".template."+tpl.Name, tpl.Name, events.Any, &rbacv1.RoleTemplateUpdated{Template: tpl, Fields: []string{"rules"}})
			}
		case r < 25:
			name := templates[rng.IntN(len(templates))]
			_, err = rbacStore.Append(ctx, SubjectPrefix+".template."+name, name, events.Any, &rbacv1.RoleTemplateDeleted{Name: name})
		case r < 50:
			b := &rbacv1.ProjectRoleBinding{Project: projects[rng.IntN(len(projects))],
				Subject:      &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: users[rng.IntN(len(users))]},
				RoleTemplate: templates[rng.IntN(len(templates))], Creator: "admin"}
			_, err = rbacStore.Append(ctx, SubjectPrefix+".binding."+b.Project, b.Project, events.Any, &rbacv1.ProjectRoleBound{Binding: b})
		case r < 65:
			p := projects[rng.IntN(len(projects))]
			_, err = rbacStore.Append(ctx, SubjectPrefix+".binding."+p, p, events.Any, &rbacv1.ProjectRoleUnbound{Project: p,
				Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: users[rng.IntN(len(users))]}, RoleTemplate: templates[rng.IntN(len(templates))]})
		case r < 85:
			id := fmt.Sprint("b", rng.IntN(10))
			_, err = nsStore.Append(ctx, subjects.NamespacePrefix+".binding."+id, id, events.Any, &projectv1.NamespaceBound{BindingId: id,
				Project: projects[rng.IntN(len(projects))], Cluster: fmt.Sprint("c", rng.IntN(3)), Namespace: fmt.Sprint("ns", rng.IntN(4))})
		case r < 92:
			id := fmt.Sprint("b", rng.IntN(10))
			_, err = nsStore.Append(ctx, subjects.NamespacePrefix+".binding."+id, id, events.Any, &projectv1.NamespaceUnbinding{BindingId: id})
		case r < 97:
			id := fmt.Sprint("b", rng.IntN(10))
			_, err = nsStore.Append(ctx, subjects.NamespacePrefix+".binding."+id, id, events.Any, &projectv1.NamespaceReleased{BindingId: id})
		default:
			p := projects[rng.IntN(len(projects))]
			_, err = nsStore.Append(ctx, subjects.NamespacePrefix+".project."+p, p, events.Any, &projectv1.ProjectDeleted{Name: p})
		}
		if err != nil {
			t.Fatal(err)
		}
		if rng.IntN(4) == 0 {
			times = append(times, time.Now())
		}
		between(i)
	}
	return append(times, time.Now())
}

// sameHistory says how two folds differ, or nil.
func sameHistory(a, b *history) error {
	if !slices.Equal(slices.Sorted(maps.Keys(a.templates)), slices.Sorted(maps.Keys(b.templates))) {
		return fmt.Errorf("templates %v vs %v", slices.Sorted(maps.Keys(a.templates)), slices.Sorted(maps.Keys(b.templates)))
	}
	for k, v := range a.templates {
		if !proto.Equal(v, b.templates[k]) {
			return fmt.Errorf("template %s: %v vs %v", k, v, b.templates[k])
		}
	}
	if !slices.Equal(slices.Sorted(maps.Keys(a.bindings)), slices.Sorted(maps.Keys(b.bindings))) {
		return fmt.Errorf("bindings %v vs %v", slices.Sorted(maps.Keys(a.bindings)), slices.Sorted(maps.Keys(b.bindings)))
	}
	for k, v := range a.bindings {
		if !proto.Equal(v, b.bindings[k]) {
			return fmt.Errorf("binding %s: %v vs %v", k, v, b.bindings[k])
		}
	}
	if !maps.Equal(a.places, b.places) {
		return fmt.Errorf("places %v vs %v", a.places, b.places)
	}
	return nil
}

type answer struct {
	h              *history
	rbacSeq, nsSeq uint64
}

// AccessAt from snapshots plus the events after them answers exactly as a replay of both
// streams from sequence 1, at many times of a random history; once the streams' early events
// are purged it still answers for every time a snapshot covers, and refuses earlier times with
// FailedPrecondition naming the earliest time it can answer.
func TestAccessAtFromSnapshotsEqualsFullReplay(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 120*time.Second)
	if err := topology.Ensure(ctx, j.JS, 1, topology.Topology{Streams: []jetstream.StreamConfig{
		topology.EventStream(subjects.NamespaceStream, "namespace events", subjects.NamespacePrefix+".>"),
	}}); err != nil {
		t.Fatal(err)
	}
	snap, err := New(ctx, j.JS, Config{Snapshots: SnapshotConfig{Every: 23, Keep: 1000}}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	full, err := New(ctx, j.JS, Config{Snapshots: SnapshotConfig{Disabled: true}}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(13, 14))
	times := randomHistory(t, j.JS, rng, 600, func(i int) {
		if rng.IntN(10) == 0 {
			if err := snap.TakeSnapshots(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	if err := snap.TakeSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := snap.snapshotsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []string{Stream, subjects.NamespaceStream} {
		heads, _, err := readIndex(ctx, kv, stream)
		if err != nil {
			t.Fatal(err)
		}
		if len(heads) < 5 {
			t.Fatalf("%s: %d snapshots, want several", stream, len(heads))
		}
	}

	reference := make([]answer, len(times))
	for i, at := range times {
		want, wr, wn, err := full.historyAt(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		reference[i] = answer{want, wr, wn}
		got, gr, gn, err := snap.historyAt(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameHistory(got, want); err != nil {
			t.Fatalf("at %s (time %d): snapshots and replay differ: %v", at.Format(time.RFC3339Nano), i, err)
		}
		if gr != wr || gn != wn {
			t.Fatalf("at time %d: sequences %d/%d, replay %d/%d", i, gr, gn, wr, wn)
		}
	}
	if len(reference[len(reference)-1].h.bindings) == 0 && len(reference[len(reference)-1].h.places) == 0 {
		t.Fatal("the random history ends empty: the comparison proves little")
	}

	// Old events go: each stream keeps only its last ~40%.
	for _, stream := range []string{Stream, subjects.NamespaceStream} {
		st, err := j.JS.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSequence(info.State.LastSeq*3/5)); err != nil {
			t.Fatal(err)
		}
	}
	if err := snap.TakeSnapshots(ctx); err != nil { // prunes what the streams cannot continue from
		t.Fatal(err)
	}
	earliest, err := snap.EarliestAccessTime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if earliest.IsZero() {
		t.Fatal("no earliest time after the purge")
	}
	var answered, refused int
	for i, at := range times {
		got, gr, gn, err := snap.historyAt(ctx, at)
		if at.Before(earliest) {
			if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), earliest.UTC().Format(time.RFC3339Nano)) {
				t.Fatalf("at %s, before the earliest time %s: got %v, want FailedPrecondition naming it", at, earliest, err)
			}
			// The API says the same.
			_, err := snap.AccessAt(ctx, connect.NewRequest(&rbacv1.AccessAtRequest{
				Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}, Time: timestamppb.New(at)}))
			if connect.CodeOf(err) != connect.CodeFailedPrecondition {
				t.Fatalf("AccessAt at %s: %v, want FailedPrecondition", at, err)
			}
			refused++
			continue
		}
		if err != nil {
			t.Fatalf("at %s, after the earliest time %s: %v", at, earliest, err)
		}
		if err := sameHistory(got, reference[i].h); err != nil {
			t.Fatalf("at time %d after the purge: %v", i, err)
		}
		if gr != reference[i].rbacSeq || gn != reference[i].nsSeq {
			t.Fatalf("at time %d after the purge: sequences %d/%d, want %d/%d", i, gr, gn, reference[i].rbacSeq, reference[i].nsSeq)
		}
		answered++
	}
	if answered == 0 || refused == 0 {
		t.Fatalf("answered %d times and refused %d: the purge point proves nothing", answered, refused)
	}
	t.Logf("after the purge: %d times answered from snapshots, %d refused (earliest %s)", answered, refused, earliest.Format(time.RFC3339Nano))
	// Without snapshots, the same early times cannot be answered at all.
	if _, _, _, err := full.historyAt(ctx, times[len(times)/2]); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("replay from sequence 1 after the purge: %v, want FailedPrecondition", err)
	}
}

// A snapshot's chunks written but never indexed (a snapshotter crashed between the two, or lost
// the index to another replica) are swept by the next snapshot; the indexed ones stay readable.
func TestUnindexedSnapshotChunksAreSwept(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	if err := topology.Ensure(ctx, j.JS, 1, topology.Topology{Streams: []jetstream.StreamConfig{
		topology.EventStream(subjects.NamespaceStream, "namespace events", subjects.NamespacePrefix+".>"),
	}}); err != nil {
		t.Fatal(err)
	}
	snap, err := New(ctx, j.JS, Config{Snapshots: SnapshotConfig{Every: 10, Keep: 1000}}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	randomHistory(t, j.JS, rng, 40, func(int) {})
	if err := snap.TakeSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	kv, err := snap.snapshotsKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	orphan := chunkKey(Stream, 1, 0)
	if _, err := kv.Put(ctx, orphan, []byte("a chunk nobody indexed")); err != nil {
		t.Fatal(err)
	}
	randomHistory(t, j.JS, rng, 40, func(int) {}) // due again
	if err := snap.TakeSnapshots(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, orphan); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("unindexed chunk %s: %v, want it swept", orphan, err)
	}
	heads, _, err := readIndex(ctx, kv, Stream)
	if err != nil {
		t.Fatal(err)
	}
	if len(heads) < 2 {
		t.Fatalf("%d snapshots indexed, want 2", len(heads))
	}
	for _, hd := range heads {
		for i := range hd.Chunks {
			if _, err := kv.Get(ctx, chunkKey(Stream, hd.Seq, i)); err != nil {
				t.Fatalf("indexed chunk %s: %v", chunkKey(Stream, hd.Seq, i), err)
			}
		}
	}
	if _, _, _, err := snap.historyAt(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkAccessAt compares AccessAt's fold of a 20,000-event history at its latest time from
// the snapshots (plus the events after the latest one) with the replay from sequence 1 it
// replaced, in the same run on the same streams.
func BenchmarkAccessAt(b *testing.B) {
	j := testkit.StartJetStream(b)
	ctx := testkit.Context(b, 10*time.Minute)
	if err := topology.Ensure(ctx, j.JS, 1, topology.Topology{Streams: []jetstream.StreamConfig{
		topology.EventStream(subjects.NamespaceStream, "namespace events", subjects.NamespacePrefix+".>"),
	}}); err != nil {
		b.Fatal(err)
	}
	snap, err := New(ctx, j.JS, Config{}, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	full, err := New(ctx, j.JS, Config{Snapshots: SnapshotConfig{Disabled: true}}, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	randomHistory(b, j.JS, rng, 20000, func(i int) {
		if i%5000 == 4999 {
			if err := snap.TakeSnapshots(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The latest snapshots trail the streams by a few hundred events, as between two snapshots.
	randomHistory(b, j.JS, rng, 500, func(int) {})
	for _, bc := range []struct {
		name string
		s    *Service
	}{{"replay-from-1", full}, {"snapshots", snap}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, _, _, err := bc.s.historyAt(ctx, time.Now()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
