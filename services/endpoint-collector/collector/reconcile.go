package collector

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
)

// Reports do not change the store directly: the ingester records the latest state of each
// slice as pending and adds the service's namespace/name to the work queue. A reconciler takes
// the key, applies everything pending for it at once and publishes one new snapshot. A burst of
// reports for one service thus costs one merge, and one service is never reconciled by two
// workers at a time (the queue guarantees it), so its parts need no lock.

type pendRef struct {
	cluster *clusterInfo
	slice   string
}

type pendingService struct {
	key, ns, name string
	changes       map[pendRef]*slice // nil: the slice is gone
	// reportedAt is the stream time of the earliest report among changes (zero: none timed).
	reportedAt time.Time
}

type pendingSet struct {
	mu   sync.Mutex
	m    map[string]*pendingService
	n    int // changes not yet applied, for readiness
	peak int // most services pending at once since m was made
}

func (p *pendingSet) put(key string, ref pendRef, s *slice, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.m[key]
	if ps == nil {
		ns, name, _ := strings.Cut(key, "/")
		ps = &pendingService{key: key, ns: ns, name: name, changes: map[pendRef]*slice{}}
		p.m[key] = ps
		p.peak = max(p.peak, len(p.m))
	}
	if _, ok := ps.changes[ref]; !ok {
		p.n++
	}
	ps.changes[ref] = s
	if !at.IsZero() && (ps.reportedAt.IsZero() || at.Before(ps.reportedAt)) {
		ps.reportedAt = at
	}
}

// key returns the key string of service key if it has pending changes.
func (p *pendingSet) key(key string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ps := p.m[key]; ps != nil {
		return ps.key, true
	}
	return "", false
}

func (p *pendingSet) take(key string) *pendingService {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.m[key]
	if ps != nil {
		delete(p.m, key)
		p.n -= len(ps.changes)
		if len(p.m) == 0 && p.peak > 1024 {
			// A map never shrinks: the one a replay grew to every service would stay.
			p.m, p.peak = map[string]*pendingService{}, 0
		}
	}
	return ps
}

func (p *pendingSet) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// internKey returns service key as a string the collector holds already (the store's, or the
// pending set's), or a copy of it: the slices of a service in every cluster then share one.
func (c *Collector) internKey(key string) string {
	if sn := c.store.state(key); sn != nil {
		return sn.key[:len(key)] // a project's key begins with it
	}
	if k, ok := c.pending.key(key); ok {
		return k
	}
	return stringsClone(key)
}

// put records the latest state of one slice (nil = gone), reported at at (zero: not timed),
// and queues its service.
func (c *Collector) put(svc string, cluster *clusterInfo, sliceName string, s *slice, at time.Time) {
	c.pending.put(svc, pendRef{cluster: cluster, slice: sliceName}, s, at)
	c.queue.Add(svc)
}

// runWorker reconciles keys until the queue shuts down.
func (c *Collector) runWorker() {
	for {
		key, shutdown := c.queue.Get()
		if shutdown {
			return
		}
		if err := c.safeReconcile(key); err != nil {
			c.log.Error("reconcile failed; retrying", zap.String("service", key), zap.Error(err))
			c.queue.AddRateLimited(key)
		} else {
			c.queue.Forget(key)
		}
		c.queue.Done(key)
	}
}

func (c *Collector) safeReconcile(key string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reconcile panic: %v", r)
		}
	}()
	c.reconcile(key)
	return nil
}

// reconcile applies the pending changes of service key and publishes its new snapshot.
func (c *Collector) reconcile(key string) {
	ps := c.pending.take(key)
	old := c.store.state(key)
	if ps == nil && old == nil {
		// Only a weight or liveness change, for a service without endpoints.
		c.notify(key)
		return
	}
	var parts []part
	if old != nil {
		all := old.parts()
		parts = make([]part, len(all), len(all)+1)
		for i := range all {
			parts[i] = all[i].part
		}
		if len(all) > len(old.clusters) { // served, then evicted: back to one order
			slices.SortFunc(parts, func(a, b part) int { return cmp.Compare(a.ref().info.name, b.ref().info.name) })
		}
	}
	if ps != nil {
		// The slices of the parts changed (few: usually one), as new arrays: the previous
		// snapshot still reads the old ones (copy on write).
		type change struct {
			cluster *clusterInfo
			slices  []slice
		}
		// On the stack while few clusters change (an append from nil would grow it on the heap).
		changed := make([]change, 0, 4)
		for ref, sl := range ps.changes {
			i, ok := findPart(parts, ref.cluster)
			if !ok {
				if sl == nil {
					continue
				}
				parts = slices.Insert(parts, i, newPart(ref.cluster.bare()))
			}
			k := slices.IndexFunc(changed, func(ch change) bool { return ch.cluster == ref.cluster })
			if k < 0 {
				k = len(changed)
				changed = append(changed, change{cluster: ref.cluster, slices: parts[i].slices()})
			}
			ch := &changed[k]
			j, ok := sort.Find(len(ch.slices), func(j int) int { return cmp.Compare(ref.slice, ch.slices[j].name()) })
			switch {
			case sl == nil && ok:
				ch.slices = slices.Delete(ch.slices, j, j+1)
			case sl != nil && ok:
				ch.slices[j] = *sl
			case sl != nil:
				ch.slices = slices.Insert(ch.slices, j, *sl)
			}
		}
		for _, ch := range changed {
			i, _ := findPart(parts, ch.cluster)
			parts[i].setSlices(ch.slices)
		}
		parts = slices.DeleteFunc(parts, func(p part) bool { return p.nslices() == 0 })
	}
	var reportedAt time.Time
	if ps != nil {
		reportedAt = ps.reportedAt
	}
	c.publish(key, old, parts, reportedAt)
	if !reportedAt.IsZero() {
		// Served: GetServiceEndpoints, the watches and the feeds answer the new snapshot now.
		c.metrics.served.Observe(max(time.Now().Round(0).Sub(reportedAt), 0).Seconds())
	}
}

// findPart finds cluster among parts, sorted by cluster name.
func findPart(parts []part, cluster *clusterInfo) (int, bool) {
	return sort.Find(len(parts), func(i int) int { return cmp.Compare(cluster.name, parts[i].ref().info.name) })
}

// publish builds and swaps in the snapshot of service key from its parts (sorted by cluster,
// not shared with anything), the clusters' liveness and the service's weights, then tells
// watchers and the KV writer. old is the service's current state, nil if none.
//
// In a namespace a project owns, what is served is one snapshot per owning project
// (ownership.go). When one project owns the namespace on every cluster reporting the service
// (the usual case), that project's snapshot is the service's whole state too: one snapshot,
// under both keys. Otherwise the whole state is a snapshot of its own, not served, and each
// project's is built from its clusters' parts.
//
// reportedAt is the earliest agent report the new snapshot takes in (zero: none timed), kept
// with each snapshot served so the xDS server can time its push (ReportedAt).
func (c *Collector) publish(key string, old *snapshot, parts []part, reportedAt time.Time) {
	var delta int64
	for i := range parts {
		delta += int64(len(parts[i].refs()))
	}
	if old != nil {
		for _, cs := range old.parts() {
			delta -= int64(len(cs.refs()))
		}
		key = old.key[:len(key)] // one copy of the key per service, whatever string the caller has
	}
	c.store.addresses.Add(delta)
	ns, name, _ := strings.Cut(key, "/")
	o := c.owning(ns)
	prevViews := c.prevViews(key, old)
	var (
		whole    *snapshot   // the service's state, when not served as it is (owned namespaces)
		served   []*snapshot // what is served now, each under its key
		projects []string
	)
	var sn *snapshot
	single := false // one project's snapshot is the whole state
	if len(parts) > 0 {
		w := c.weightsOf(ns, name)
		sn = c.assemble(key, parts, w)
		sn.version = c.store.version.Add(1)
		sn.reportedAt = reportedAt
		var groups [][]part
		if o != nil {
			projects, groups = groupByOwner(parts, o)
		}
		switch {
		case o == nil:
			served = []*snapshot{sn}
		case len(projects) == 1 && len(groups[0]) == len(parts):
			sn.key = internedKey(projectKey(key, projects[0]), prevViews)
			whole, served, single = sn, []*snapshot{sn}, true
		default:
			whole = sn
			for i, p := range projects {
				vk := internedKey(projectKey(key, p), prevViews)
				v := c.assemble(vk, groups[i], w)
				if cur := c.store.snapshot(vk); cur != nil && cur != old && sameServed(cur, v) {
					continue // another project's clusters changed: this one's watchers, caches and proxies are not told
				}
				v.version = c.store.version.Add(1)
				v.reportedAt = reportedAt
				served = append(served, v)
			}
		}
	}
	var dropped []string
	for _, vk := range prevViews {
		if !slices.Contains(projects, vk[len(key)+len(viewSep):]) {
			dropped = append(dropped, vk)
		}
	}
	released, baseWasServed := c.store.publish(key, whole, served, dropped)
	for _, gone := range released {
		gone.release(c.codec)
	}
	if single {
		c.rememberViews(key, nil)
	} else {
		c.rememberViews(key, projects)
	}
	if sn != nil {
		// A liveness or cluster id change that came while this snapshot was being built may
		// have looked for the service's clusters in the snapshot before (Store.servicesIn):
		// publish again.
		all := sn.parts()
		for i := range all {
			cs := &all[i]
			st := cs.ref().info.State()
			if (i < len(sn.clusters)) != (st != stateEvicted) || (i < len(sn.clusters) && (cs.stale() != (st == stateStale) || cs.clusterID() != cs.ref().info.ID())) {
				c.queue.Add(key)
				break
			}
		}
	}
	// The service's key is told always (its whole state's watchers: admins, awaitWeights);
	// feeds and the bucket writer are told of what is or was served under its key.
	if baseWasServed || (sn != nil && whole == nil) {
		c.notify(key)
	} else {
		c.store.hub.notify(key)
		c.metrics.reconciles.Inc()
	}
	for _, v := range served {
		if v.key != key {
			c.notify(v.key)
		}
	}
	for _, vk := range dropped {
		c.notify(vk)
	}
	if c.onPublish != nil && sn != nil {
		c.onPublish(sn)
	}
}

// internedKey returns key as held in keys if it is there (one copy per view).
func internedKey(key string, keys []string) string {
	if i := slices.Index(keys, key); i >= 0 {
		return keys[i]
	}
	return key
}

// prevViews returns the keys of the projects' snapshots service key serves now, old its state.
func (c *Collector) prevViews(key string, old *snapshot) []string {
	if old != nil && isView(old.key) {
		return []string{old.key} // the one project's, which is the whole state
	}
	if c.nviews.Load() == 0 {
		return nil // no view anywhere: a fleet without owned namespaces takes no lock here
	}
	c.viewsMu.Lock()
	defer c.viewsMu.Unlock()
	return c.views[key]
}

// rememberViews records the projects whose snapshots service key serves apart from its whole
// state (none: it serves its state as it is, or one project's that is its whole state).
func (c *Collector) rememberViews(key string, projects []string) {
	if len(projects) == 0 && c.nviews.Load() == 0 {
		return
	}
	c.viewsMu.Lock()
	defer c.viewsMu.Unlock()
	if len(projects) == 0 {
		delete(c.views, key)
	} else {
		vks := make([]string, len(projects))
		for i, p := range projects {
			vks[i] = internedKey(projectKey(key, p), c.views[key])
		}
		c.views[key] = vks
	}
	c.nviews.Store(int64(len(c.views)))
}

// sameServed reports whether a and b serve the same: the same parts, liveness and ids (a
// part's record holds its clusterRef) and the same weights in effect.
func sameServed(a, b *snapshot) bool {
	if len(a.clusters) != len(b.clusters) || !slices.Equal(a.parts(), b.parts()) {
		return false
	}
	var wa, wb snapWeights
	if a.weights != nil {
		wa = *a.weights
	}
	if b.weights != nil {
		wb = *b.weights
	}
	return slices.Equal(wa.overrides, wb.overrides) && slices.Equal(wa.ends, wb.ends) && slices.Equal(wa.clusters, wb.clusters)
}

// assemble builds the snapshot of key from parts (sorted by cluster, not shared with anything;
// each is copied), the clusters' liveness and weights w: served clusters first, then evicted
// ones, each by name. It has no version yet.
func (c *Collector) assemble(key string, parts []part, w *endpointv1.ServiceWeights) *snapshot {
	sn := &snapshot{key: key}
	// clusters is the served ones and the array's capacity holds them all (snapshot.parts).
	all := make([]clusterSnap, len(parts))
	var buf [8]clusterState
	states := buf[:0]
	evicted := 0 // where the evicted go: after the served ones
	for i := range parts {
		states = append(states, parts[i].ref().info.State())
		if states[i] != stateEvicted {
			evicted++
		}
	}
	served := 0
	var sw *snapWeights
	if w != nil {
		sw = &snapWeights{rev: w.Revision}
	}
	weighted := false // a served cluster's weight is not DefaultWeight
	for i, p := range parts {
		info := p.ref().info
		state := states[i]
		if state == stateEvicted {
			p.setRef(info.bare())
			all[evicted] = clusterSnap{part: p}
			evicted++
			continue
		}
		p.setRef(info.ref(info.ID(), state == stateStale))
		if w != nil {
			cw, ok := w.ClusterWeights[info.name]
			if !ok {
				cw = DefaultWeight
			}
			weighted = weighted || cw != DefaultWeight
			sw.clusters = append(sw.clusters, cw)
			sw.overrides = appendOverrides(sw.overrides, w, info.name)
			sw.ends = append(sw.ends, int32(len(sw.overrides)))
		}
		all[served] = clusterSnap{part: p}
		served++
	}
	if sw != nil && len(sw.overrides) == 0 {
		sw.ends = nil
	}
	if sw != nil && !weighted {
		sw.clusters = nil
	}
	sn.weights = sw
	sn.clusters = all[:served]
	return sn
}

func (c *Collector) notify(key string) {
	c.store.hub.notify(key)
	c.notifyFeeds(key)
	if c.kv != nil {
		c.kv.mark(key)
	}
	c.metrics.reconciles.Inc()
}

// appendOverrides appends the endpoint weights of w that apply in cluster.
func appendOverrides(out []override, w *endpointv1.ServiceWeights, cluster string) []override {
	for _, ew := range w.EndpointWeights {
		if ew.ClusterName != cluster {
			continue
		}
		a, err := netip.ParseAddr(ew.Ip)
		if err != nil {
			continue
		}
		o := override{weight: ew.Weight}
		o.addr, _ = addrBytes(a)
		if ew.TargetUid != "" {
			o.uid, o.hasUID = uidBytes(ew.TargetUid), true
		}
		out = append(out, o)
	}
	return out
}

// evaluate sets cluster's liveness from how long its agent has been silent and re-reconciles its
// services when it changes.
func (c *Collector) evaluate(ci *clusterInfo) {
	silent := c.now().Sub(time.Unix(0, ci.lastSeen.Load()))
	next := stateLive
	switch {
	case ci.deregistered.Load(), silent > c.cfg.EvictAfter:
		next = stateEvicted
	case silent > c.cfg.StaleAfter || ci.resyncing.Load():
		next = stateStale
	}
	prev := clusterState(ci.state.Swap(int32(next)))
	if prev == next {
		return
	}
	c.log.Info("cluster liveness changed", zap.String("cluster", ci.name), zap.Stringer("from", prev),
		zap.Stringer("to", next), zap.Duration("silentFor", silent.Round(time.Millisecond)))
	// Services whose slices are pending are in the queue already.
	for _, key := range c.store.servicesIn(ci) {
		c.queue.Add(key)
	}
}
