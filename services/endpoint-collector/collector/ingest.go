package collector

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
)

// The ingester turns agent messages into pending slice changes and work-queue keys. It keeps,
// per cluster, which slice belongs to which service and which relist reported it last: that
// is what a relist marker prunes by, and what a liveness change re-reconciles.

// report kinds: the fourth token of fleet.agent.<cluster>.<kind>...
const (
	kindHeartbeat = "heartbeat"
	kindSlice     = "endpointslice"
	kindSync      = "endpointsync"
)

// relist is an agent session and relist generation, as a relist marker names them.
type relist struct {
	session string
	gen     uint64
}

func (r *relist) is(session string, gen uint64) bool { return r.session == session && r.gen == gen }

// clusterIngest is what the ingester keeps of one cluster: each slice's latest buf (which says
// its service), and which relist reported each slice last. The relist is kept as exceptions to
// a base rather than per slice: between relists every slice was last reported by the same one,
// so the index holds only the buf (see sliceIndex) and others is empty. While an agent
// relists, others holds the slices reported by the new relist (or, once most are, the base
// moves to it and others holds those not reported yet); the marker prunes what the relist did
// not report and empties others.
type clusterIngest struct {
	info *clusterInfo
	// slices is each slice's latest buf, by namespace then slice name.
	slices map[string]*sliceIndex
	n      int                 // slices in slices
	base   *relist             // the relist of every slice not in others
	others map[sliceID]*relist // slices last reported by a relist other than base; nil when none
	counts map[relist]int      // entries of others by relist; nil with others
	cur    *relist             // of the latest report
	// endpoints is the number of endpoints of the slices in slices; with n, what Limits bound.
	endpoints int
	// overLimit is the limit the cluster's reports were last refused for ("" within its
	// limits), refusedIn the relist of that report (limits.go).
	overLimit string
	refusedIn *relist
}

func newClusterIngest(info *clusterInfo, rl *relist) *clusterIngest {
	return &clusterIngest{info: info, slices: map[string]*sliceIndex{}, base: rl, cur: rl}
}

// sliceID names a slice of a cluster.
type sliceID struct{ ns, name string }

// serviceOf returns the name of the service of slice ns/name and its number of endpoints, if
// the cluster has it.
func (ci *clusterIngest) serviceOf(ns, name string) (string, int, bool) {
	x := ci.slices[ns]
	if x == nil {
		return "", 0, false
	}
	buf, ok := x.get(name)
	if !ok {
		return "", 0, false
	}
	s := &slice{buf: buf}
	return s.service(), s.n(), true
}

// set records buf as the latest of its slice, in namespace ns, in place of one of prevN
// endpoints, and returns the namespace as the index holds it. The index keeps the buf of the
// latest report only, which the store's part shares; TestIndexKeysTheCurrentSlice checks it.
func (ci *clusterIngest) set(ns, buf string, prevN int) string {
	x, ok := ci.slices[ns]
	if !ok {
		ns = stringsClone(ns) // not the subject's, which the map would keep
		x = newSliceIndex()
		ci.slices[ns] = x
	}
	if x.put(buf) {
		ci.n++
	}
	ci.endpoints += (&slice{buf: buf}).n() - prevN
	return ns
}

// del forgets slice ns/name, and its namespace with the last slice of it.
func (ci *clusterIngest) del(ns, name string) {
	x := ci.slices[ns]
	if x == nil {
		return
	}
	buf, ok := x.del(name)
	if !ok {
		return
	}
	ci.n--
	ci.endpoints -= (&slice{buf: buf}).n()
	if x.len() == 0 {
		delete(ci.slices, ns)
	}
	ci.forget(sliceID{ns, name})
}

// each calls f for every slice of the cluster with the name of its service; f may delete the
// slice it is given.
func (ci *clusterIngest) each(f func(id sliceID, svc string)) {
	for ns, x := range ci.slices {
		x.each(func(buf string) {
			s := slice{buf: buf}
			f(sliceID{ns, s.name()}, s.service())
		})
	}
}

// relistOf returns the relist that last reported slice id.
func (ci *clusterIngest) relistOf(id sliceID) *relist {
	if rl, ok := ci.others[id]; ok {
		return rl
	}
	return ci.base
}

// stamp records that relist rl last reported slice id (in ci.slices). Once rl has reported
// more than three quarters of the slices, it becomes the base: others then holds less than a
// quarter, and going back takes as many reports again, so reports of two sessions interleaved
// (an agent's old and new pod, briefly) cost O(1) each, amortized.
func (ci *clusterIngest) stamp(id sliceID, rl *relist) {
	ci.forget(id)
	if rl.is(ci.base.session, ci.base.gen) {
		return
	}
	ci.except(id, rl)
	if ci.counts[*rl]*4 > ci.n*3 {
		ci.rebase(rl)
	}
}

func (ci *clusterIngest) except(id sliceID, rl *relist) {
	if ci.others == nil {
		ci.others, ci.counts = map[sliceID]*relist{}, map[relist]int{}
	}
	ci.others[id] = rl
	ci.counts[*rl]++
}

// forget drops slice id's exception, and the maps with the last of them (a map never shrinks:
// the one a relist grew would stay).
func (ci *clusterIngest) forget(id sliceID) {
	rl, ok := ci.others[id]
	if !ok {
		return
	}
	delete(ci.others, id)
	if ci.counts[*rl]--; ci.counts[*rl] == 0 {
		delete(ci.counts, *rl)
	}
	if len(ci.others) == 0 {
		ci.others, ci.counts = nil, nil
	}
}

// prune calls drop (which deletes the slice) for every slice not last reported by relist
// (session, gen), and returns how many; the relist is then every slice's.
func (ci *clusterIngest) prune(session string, gen uint64, drop func(id sliceID, svc string)) int {
	pruned := 0
	var kept *relist
	ci.each(func(id sliceID, svc string) {
		if rl := ci.relistOf(id); rl.is(session, gen) {
			kept = rl
			return
		}
		drop(id, svc)
		pruned++
	})
	if kept != nil {
		ci.base, ci.others, ci.counts = kept, nil, nil
	}
	return pruned
}

// rebase makes rl the base; every slice keeps the relist it has.
func (ci *clusterIngest) rebase(rl *relist) {
	old := ci.base
	ci.each(func(id sliceID, _ string) {
		if _, ok := ci.others[id]; !ok {
			ci.except(id, old)
		}
	})
	ci.base = rl
	for id, o := range ci.others {
		if o.is(rl.session, rl.gen) {
			ci.forget(id)
		}
	}
}

type ingester struct {
	c *Collector
	// fast decodes a slice report straight from the wire (wire.go), or declines with
	// errSlowPath; BenchmarkSliceReplay swaps in one that always declines, to measure the
	// generated code alone.
	fast func(data []byte, name string) (reportHeader, *slice, error)

	mu       sync.Mutex
	clusters map[string]*clusterIngest
	// reportAt is the stream time of the report handle is applying, once the collector has
	// caught up with the stream (a replayed report's age says nothing about now), else zero:
	// what its service's next snapshot is measured from (fleetstream_endpoint_report_*).
	reportAt time.Time
}

func newIngester(c *Collector) *ingester {
	return &ingester{c: c, fast: c.store.decodeReport, clusters: map[string]*clusterIngest{}}
}

func (in *ingester) cluster(name string) *clusterIngest {
	ci := in.clusters[name]
	if ci == nil {
		ci = newClusterIngest(in.c.store.cluster(name), &relist{})
		in.clusters[name] = ci
	}
	return ci
}

// servicesOf returns the keys of the services cluster has slices of (applied: those pending are
// in the work queue already).
func (in *ingester) servicesOf(cluster string) []string {
	return in.c.store.servicesIn(in.c.store.cluster(cluster))
}

// errMalformed marks a message that can never be applied: it is dead-lettered.
var errMalformed = errors.New("malformed agent report")

// handle applies one message of stream FLEET_AGENT received by the server at ts.
func (in *ingester) handle(subject string, data []byte, ts time.Time) error {
	toks := strings.Split(subject, ".")
	if len(toks) < 4 {
		return fmt.Errorf("%w: subject %s", errMalformed, subject)
	}
	cluster, err := keys.Decode(toks[2])
	if err != nil {
		return fmt.Errorf("%w: subject %s: %v", errMalformed, subject, err)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	select {
	case <-in.c.caughtUp:
		in.reportAt = ts
	default:
	}
	defer func() { in.reportAt = time.Time{} }()
	ci := in.cluster(cluster)
	in.touch(ci, ts)
	switch toks[3] {
	case kindHeartbeat:
		return nil // liveness only; the payload is cluster-import's business
	case kindSlice:
		if len(toks) != 6 {
			return fmt.Errorf("%w: subject %s", errMalformed, subject)
		}
		ns, err1 := keys.Decode(toks[4])
		name, err2 := keys.Decode(toks[5])
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("%w: subject %s: %v", errMalformed, subject, err)
		}
		h, sl, err := in.fast(data, name)
		if err != nil {
			// The generated code decodes what the fast path declined, or says what is wrong.
			if h, sl, err = in.decodeSlow(data, subject, name); err != nil {
				return err
			}
		}
		return in.slice(ci, ns, name, h, sl)
	case kindSync:
		ev, err := events.Decode(data)
		if err != nil {
			return fmt.Errorf("%w: %v", errMalformed, err)
		}
		m, ok := ev.Payload.(*endpointv1.EndpointSliceSync)
		if !ok {
			return fmt.Errorf("%w: %s on %s", errMalformed, ev.Type, subject)
		}
		in.synced(ci, m)
		return nil
	}
	return nil // another report kind this collector does not read
}

// seen records that cluster's agent was heard at ts (known from elsewhere than a report).
func (in *ingester) seen(cluster string, ts time.Time) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.touch(in.cluster(cluster), ts)
}

// touch records that cluster's agent was heard at ts. A silence longer than the evict delay
// means the cluster was (or would have been) evicted: until its agent's next relist completes
// it is served as stale, since whatever changed meanwhile has not been reported yet. Judged on
// server timestamps, a replay after a restart comes to the same verdict as live processing.
func (in *ingester) touch(ci *clusterIngest, ts time.Time) {
	n := ts.UnixNano()
	prev := ci.info.lastSeen.Load()
	if n <= prev {
		return
	}
	ci.info.lastSeen.Store(n)
	if prev != 0 && time.Duration(n-prev) > in.c.cfg.EvictAfter && !ci.info.resyncing.Swap(true) {
		in.c.log.Info("cluster agent back after eviction; stale until its relist completes",
			zap.String("cluster", ci.info.name), zap.Duration("silentFor", time.Duration(n-prev).Round(time.Millisecond)))
	}
	in.c.evaluate(ci.info)
}

// decodeSlow decodes a slice report with the generated code: what the fast path declined, and
// the reference the fast path is tested against (wire_test.go).
func (in *ingester) decodeSlow(data []byte, subject, name string) (reportHeader, *slice, error) {
	env := &eventv1.Envelope{}
	if err := proto.Unmarshal(data, env); err != nil {
		return reportHeader{}, nil, fmt.Errorf("%w: decode envelope: %v", errMalformed, err)
	}
	r := &endpointv1.EndpointSliceReport{}
	if !env.GetPayload().MessageIs(r) {
		return reportHeader{}, nil, fmt.Errorf("%w: payload %q on %s", errMalformed, env.GetPayload().GetTypeUrl(), subject)
	}
	if err := proto.Unmarshal(env.Payload.Value, r); err != nil {
		return reportHeader{}, nil, fmt.Errorf("%w: decode %s: %v", errMalformed, env.Payload.TypeUrl, err)
	}
	h := reportHeader{clusterID: r.ClusterId, service: r.Service, session: r.SessionId, deleted: r.Deleted, generation: r.Generation}
	if h.deleted || h.service == "" {
		return h, nil, nil
	}
	sl, err := in.c.store.convert(r, name)
	if err != nil {
		return h, nil, fmt.Errorf("%w: %v", errMalformed, err)
	}
	return h, sl, nil
}

// slice applies one report: sl is the slice's new state, nil when it is gone.
func (in *ingester) slice(ci *clusterIngest, ns, name string, r reportHeader, sl *slice) error {
	prev, prevN, had := ci.serviceOf(ns, name)
	if r.clusterID != "" && !in.c.idFromRegistry(ci.info.name) {
		ci.info.setID(r.clusterID)
	}
	if sl == nil {
		// Deleted, or without a service label (it then serves no Service): as good as gone.
		if had {
			in.drop(ci, ns, name, prev)
		}
		return nil
	}
	// The decoders name the slice (one copy of its name, in its buf, where the index's is too);
	// one that did not (a test's) is named here.
	if sl.name() != name || sl.service() != r.service {
		if !sl.setName(name, r.service) {
			return fmt.Errorf("%w: slice name of %d bytes or service name of %d", errMalformed, len(name), len(r.service))
		}
	}
	if had && prev != r.service {
		in.drop(ci, ns, name, prev)
		had, prevN = false, 0
	}
	if !ci.cur.is(r.session, r.generation) {
		ci.cur = &relist{session: stringsClone(r.session), gen: r.generation}
	}
	slices := ci.n
	if !had {
		slices++
	}
	if limit := in.c.cfg.Limits.exceeded(slices, ci.endpoints-prevN+sl.n()); limit != "" {
		if had {
			in.drop(ci, ns, name, prev)
		}
		in.refuse(ci, limit)
		return nil
	}
	name = sl.name()
	ci.stamp(sliceID{ci.set(ns, sl.buf, prevN), name}, ci.cur)
	in.c.put(in.c.internKey(ns+"/"+r.service), ci.info, name, sl, in.reportAt)
	return nil
}

// drop forgets slice ns/name of service svc (its name).
func (in *ingester) drop(ci *clusterIngest, ns, name, svc string) {
	ci.del(ns, name)
	in.c.put(in.c.internKey(ns+"/"+svc), ci.info, name, nil, in.reportAt)
}

// synced applies a relist marker: every slice of the cluster the relist did not report is gone.
// Nothing is pruned before the marker, so a reconnecting agent never blanks its cluster.
func (in *ingester) synced(ci *clusterIngest, m *endpointv1.EndpointSliceSync) {
	pruned := ci.prune(m.SessionId, m.Generation, func(id sliceID, svc string) {
		in.drop(ci, id.ns, id.name, svc)
	})
	in.withinLimits(ci, m.SessionId, m.Generation)
	if ci.info.resyncing.Swap(false) {
		in.c.evaluate(ci.info)
	}
	if pruned > 0 {
		in.c.log.Info("relist complete; pruned slices it no longer has", zap.String("cluster", ci.info.name),
			zap.Uint64("generation", m.Generation), zap.Int("pruned", pruned))
	}
	in.c.metrics.pruned.Add(float64(pruned))
}
