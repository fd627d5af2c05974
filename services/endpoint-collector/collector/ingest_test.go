package collector

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// The relist bookkeeping (a base and exceptions) answers, for every slice, the relist that
// reported it last, as a map of slice to relist would, through reports of interleaved sessions,
// deletions and markers; and keeps no exception once a marker has pruned.
func TestRelistBookkeepingMatchesPerSliceStamps(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 1))
		ci := newClusterIngest(nil, &relist{})
		want := map[sliceID]relist{} // the model: each slice's last relist
		relists := []relist{{"a", 1}, {"a", 2}, {"b", 1}}
		for step := range 3000 {
			rl := relists[rng.IntN(len(relists))]
			key := sliceID{fmt.Sprintf("ns-%d", rng.IntN(3)), fmt.Sprintf("s-%d", rng.IntN(70))}
			switch op := rng.IntN(100); {
			case op < 85: // a report
				if !ci.cur.is(rl.session, rl.gen) {
					ci.cur = &relist{session: rl.session, gen: rl.gen}
				}
				ci.stamp(sliceID{ci.set(key.ns, namedBuf(key.name, "svc"), 0), key.name}, ci.cur)
				want[key] = rl
			case op < 95: // a deletion
				if _, _, ok := ci.serviceOf(key.ns, key.name); ok {
					ci.del(key.ns, key.name)
					delete(want, key)
				}
			default: // a marker
				n := ci.prune(rl.session, rl.gen, func(id sliceID, _ string) { ci.del(id.ns, id.name) })
				pruned := 0
				for k, r := range want {
					if r != rl {
						delete(want, k)
						pruned++
					}
				}
				if n != pruned {
					t.Fatalf("seed %d step %d: marker %v pruned %d, want %d", seed, step, rl, n, pruned)
				}
				if len(want) > 0 && ci.others != nil {
					t.Fatalf("seed %d step %d: %d exceptions left after a marker", seed, step, len(ci.others))
				}
			}
			indexed := 0
			ci.each(func(sliceID, string) { indexed++ })
			if indexed != len(want) || ci.n != len(want) || len(ci.slices) > 3 {
				t.Fatalf("seed %d step %d: %d slices (counted %d) in %d namespaces, want %d", seed, step, indexed, ci.n, len(ci.slices), len(want))
			}
			counted := 0
			for _, n := range ci.counts {
				counted += n
			}
			if counted != len(ci.others) || (ci.others == nil) != (ci.counts == nil) {
				t.Fatalf("seed %d step %d: counts %v for %d exceptions", seed, step, ci.counts, len(ci.others))
			}
			for k, r := range want {
				if got := ci.relistOf(k); !got.is(r.session, r.gen) {
					t.Fatalf("seed %d step %d: %s last reported by %v, bookkeeping says %v", seed, step, k, r, *got)
				}
			}
		}
	}
}

// Reports of one relist make it the base: no exception is kept for them, so between relists the
// ingester holds nothing per slice but its service.
func TestRelistBookkeepingSettlesOnTheReportingRelist(t *testing.T) {
	ci := newClusterIngest(nil, &relist{session: "s", gen: 1})
	for i := range 1000 {
		name := fmt.Sprintf("s-%d", i)
		ci.stamp(sliceID{ci.set("ns", namedBuf(name, "svc"), 0), name}, ci.cur)
	}
	if ci.others != nil || !ci.base.is("s", 1) {
		t.Fatalf("base %v, %d exceptions; want the reporting relist and none", *ci.base, len(ci.others))
	}
	// A new relist re-reports most slices: the base moves to it once it has three quarters.
	next := &relist{session: "s", gen: 2}
	for i := range 900 {
		ci.stamp(sliceID{"ns", fmt.Sprintf("s-%d", i)}, next)
	}
	if !ci.base.is("s", 2) || len(ci.others) != 100 {
		t.Fatalf("base %v, %d exceptions; want s/2 and the 100 not re-reported", *ci.base, len(ci.others))
	}
}

// namedBuf returns the buf of a slice without endpoints named name, of service svc.
func namedBuf(name, svc string) string {
	buf, _ := encodeSlice(name, svc, nil, nil)
	return buf
}

// The index holds the buf of a slice's latest report, not of the first: an entry that kept the
// one it was made with would keep that report's buf (endpoints, targets and all) alive.
func TestIndexKeysTheCurrentSlice(t *testing.T) {
	c := newCollector(Config{}, quietLogger())
	var last *slice
	c.ingest.fast = func(data []byte, name string) (reportHeader, *slice, error) {
		h, sl, err := c.store.decodeReport(data, name)
		last = sl
		return h, sl, err
	}
	for seq := range uint32(3) {
		rep := benchSlice("east", 1, 0, 2, seq)
		if err := c.ingest.handle(subjects.AgentEndpointSlice("east", "bench", rep.Slice), encodeReport(t, rep), time.Now()); err != nil {
			t.Fatal(err)
		}
		x := c.ingest.clusters["east"].slices["bench"]
		if x.len() != 1 {
			t.Fatalf("report %d: %d slices indexed", seq, x.len())
		}
		x.each(func(buf string) {
			if unsafe.StringData(buf) != unsafe.StringData(last.buf) || (&slice{buf: buf}).service() != rep.Service {
				t.Fatalf("report %d: the index does not hold the slice's latest buf", seq)
			}
		})
	}
}
