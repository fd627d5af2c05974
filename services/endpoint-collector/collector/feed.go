package collector

import (
	"sync"
	"time"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
)

// Feed tells a consumer of every service (the xDS server) which services changed. Like the
// watch hub it coalesces: changed keys accumulate in a set and one token wakes the consumer, so a
// slow consumer reads each changed service once, at its latest state, instead of every step.
type Feed struct {
	c     *Collector
	mu    sync.Mutex
	dirty map[string]struct{}
	wake  chan struct{}
}

// ServiceRef names a service: in a namespace a project owns, the project's (docs/endpoints.md,
// "Who owns a service's endpoints"); Project is "" for a service merged across every cluster.
type ServiceRef struct{ Namespace, Name, Project string }

// Feed registers a change feed. Every service served now is marked changed, so the first Take
// returns the whole state; Close unregisters it.
func (c *Collector) Feed() *Feed {
	f := &Feed{c: c, dirty: map[string]struct{}{}, wake: make(chan struct{}, 1)}
	c.feedsMu.Lock()
	c.feeds = append(c.feeds, f)
	c.feedsMu.Unlock()
	for _, sn := range c.store.Services(nil) {
		f.mark(sn.key)
	}
	return f
}

// Changed receives a token when services changed since the last Take.
func (f *Feed) Changed() <-chan struct{} { return f.wake }

// Take returns the services changed since the last Take (those gone included) and resets the set.
func (f *Feed) Take() []ServiceRef {
	f.mu.Lock()
	dirty := f.dirty
	f.dirty = map[string]struct{}{}
	f.mu.Unlock()
	out := make([]ServiceRef, 0, len(dirty))
	for k := range dirty {
		ns, name, project := splitKey(k)
		out = append(out, ServiceRef{Namespace: ns, Name: name, Project: project})
	}
	return out
}

// Close unregisters the feed.
func (f *Feed) Close() {
	f.c.feedsMu.Lock()
	defer f.c.feedsMu.Unlock()
	for i, g := range f.c.feeds {
		if g == f {
			f.c.feeds = append(f.c.feeds[:i:i], f.c.feeds[i+1:]...)
			return
		}
	}
}

func (f *Feed) mark(key string) {
	f.mu.Lock()
	f.dirty[key] = struct{}{}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (c *Collector) notifyFeeds(key string) {
	c.feedsMu.RLock()
	defer c.feedsMu.RUnlock()
	for _, f := range c.feeds {
		f.mark(key)
	}
}

// Endpoints returns every endpoint of service ns/name as served now (the ALL filter: with their
// conditions, weights and clusters' staleness), or false when the service has none anywhere.
// The message may be the snapshot's cached response, shared: callers must not modify it. A
// response built here is not cached: a feed reads every service once per change, which would
// fill the response cache with services no API client asked for.
func (c *Collector) Endpoints(ns, name string) (*endpointv1.GetServiceEndpointsResponse, bool) {
	return c.ServiceEndpoints(ServiceRef{Namespace: ns, Name: name})
}

// ServiceEndpoints is Endpoints of the service ref names (a project's, in an owned namespace).
func (c *Collector) ServiceEndpoints(ref ServiceRef) (*endpointv1.GetServiceEndpointsResponse, bool) {
	key := serviceKey(ref.Namespace, ref.Name)
	if ref.Project != "" {
		key = projectKey(key, ref.Project)
	}
	sn := c.store.snapshot(key)
	if sn == nil {
		return nil, false
	}
	return sn.peek(c.env.strs, endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL), true
}

// ReportedAt is the stream time of the earliest agent report the service's current snapshot
// took in, or zero when it took in none (a weight or liveness change, a replay at start) or
// the service has none: what the xDS server times its push from.
func (c *Collector) ReportedAt(ref ServiceRef) time.Time {
	key := serviceKey(ref.Namespace, ref.Name)
	if ref.Project != "" {
		key = projectKey(key, ref.Project)
	}
	if sn := c.store.snapshot(key); sn != nil {
		return sn.reportedAt
	}
	return time.Time{}
}
