package collector

import (
	"fmt"
	"net/netip"
	"slices"
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
	ns, name string
	changes  map[pendRef]*slice // nil: the slice is gone
}

type pendingSet struct {
	mu sync.Mutex
	m  map[string]*pendingService
	n  int // changes not yet applied, for readiness
}

func (p *pendingSet) put(key string, ref pendRef, s *slice) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.m[key]
	if ps == nil {
		ns, name, _ := strings.Cut(key, "/")
		ps = &pendingService{ns: ns, name: name, changes: map[pendRef]*slice{}}
		p.m[key] = ps
	}
	if _, ok := ps.changes[ref]; !ok {
		p.n++
	}
	ps.changes[ref] = s
}

func (p *pendingSet) take(key string) *pendingService {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := p.m[key]
	if ps != nil {
		delete(p.m, key)
		p.n -= len(ps.changes)
	}
	return ps
}

func (p *pendingSet) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// put records the latest state of one slice (nil = gone) and queues its service.
func (c *Collector) put(svc string, cluster *clusterInfo, sliceName string, s *slice) {
	c.pending.put(svc, pendRef{cluster: cluster, slice: sliceName}, s)
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
	var s *service
	if ps != nil {
		s = c.store.service(key, ps.ns, ps.name)
	} else {
		c.store.mu.RLock()
		s = c.store.services[key]
		c.store.mu.RUnlock()
		if s == nil {
			// Only a weight or liveness change, for a service without endpoints.
			c.notify(key)
			return
		}
	}
	if ps != nil {
		dirty := make(map[*part]bool, 1)
		for ref, sl := range ps.changes {
			_, p := s.part(ref.cluster, sl != nil)
			if p == nil {
				continue
			}
			if !dirty[p] {
				// Copy on write: the previous snapshot still reads the old array.
				p.slices = slices.Clone(p.slices)
				dirty[p] = true
			}
			i, ok := p.find(ref.slice)
			switch {
			case sl == nil && ok:
				p.slices = slices.Delete(p.slices, i, i+1)
			case sl != nil && ok:
				p.slices[i] = sl
			case sl != nil:
				p.slices = slices.Insert(p.slices, i, sl)
			}
		}
		for p := range dirty {
			p.merge()
		}
		s.parts = slices.DeleteFunc(slices.Clone(s.parts), func(p *part) bool { return len(p.slices) == 0 })
	}
	c.publish(s)
}

// publish builds and swaps in the snapshot of s from its parts, the clusters' liveness and the
// service's weights, then tells watchers and the KV writer.
func (c *Collector) publish(s *service) {
	if len(s.parts) == 0 {
		c.store.dropService(s)
		if old := s.snap.Swap(nil); old != nil {
			old.release()
		}
		c.notify(s.key)
		return
	}
	sn := &snapshot{ns: s.ns, name: s.name, version: c.store.version.Add(1), strs: c.store.strs, codec: c.codec,
		clusters: make([]clusterSnap, 0, len(s.parts))}
	w := c.weightsOf(s.ns, s.name)
	if w != nil {
		sn.weightsRev = w.Revision
	}
	for _, p := range s.parts {
		state := p.cluster.State()
		if state == stateEvicted {
			continue
		}
		cs := clusterSnap{name: p.cluster.name, id: p.cluster.ID(), stale: state == stateStale,
			lastSeen: p.cluster.lastSeen.Load(), weight: DefaultWeight, slices: p.slices, merged: p.merged}
		if w != nil {
			if cw, ok := w.ClusterWeights[cs.name]; ok {
				cs.weight = cw
			}
			cs.overrides = overridesFor(w, cs.name)
		}
		for _, r := range cs.merged {
			if cs.slices[r.s].eps[r.e].flags&fReady != 0 {
				sn.ready++
			}
		}
		sn.total += uint32(len(cs.merged))
		sn.clusters = append(sn.clusters, cs)
	}
	if old := s.snap.Swap(sn); old != nil {
		old.release()
	}
	c.notify(s.key)
	if c.onPublish != nil {
		c.onPublish(sn)
	}
}

func (c *Collector) notify(key string) {
	c.store.hub.notify(key)
	c.notifyFeeds(key)
	if c.kv != nil {
		c.kv.mark(key)
	}
	c.metrics.reconciles.Inc()
}

// overridesFor returns the endpoint weights of w that apply in cluster.
func overridesFor(w *endpointv1.ServiceWeights, cluster string) []override {
	var out []override
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
// services when it changes. Called with the ingester's lock held (services is its map).
func (c *Collector) evaluate(ci *clusterInfo, services map[string]int) {
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
	for key := range services {
		c.queue.Add(key)
	}
}
