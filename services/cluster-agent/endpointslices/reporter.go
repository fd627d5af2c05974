// Package endpointslices is the agent side of endpoint collection: it watches the member
// cluster's EndpointSlices (discovery.k8s.io/v1) with a shared informer and reports each slice
// as a snapshot on fleet.agent.<cluster>.endpointslice.<namespace>.<slice>, a tombstone when it
// is gone, and after every full relist a marker (fleet.agent.<cluster>.endpointsync) telling the
// collector that whatever this relist did not report is gone.
package endpointslices

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Appender publishes one report; *events.Store is one.
type Appender interface {
	Append(ctx context.Context, subject, aggregateID string, expect events.Expect, payload proto.Message) (uint64, error)
}

// Filter selects the Services whose slices are reported.
type Filter struct {
	// Kind is "all", "label" or "annotation".
	Kind string
	Key  string
	// Value, when HasValue, must equal the label or annotation; otherwise presence is enough.
	Value    string
	HasValue bool
}

// ParseFilter reads the --endpointslices flag: "all", "label=<key>[=<value>]" or
// "annotation=<key>[=<value>]".
func ParseFilter(s string) (Filter, error) {
	if s == "" || s == "all" {
		return Filter{Kind: "all"}, nil
	}
	kind, rest, ok := strings.Cut(s, "=")
	if !ok || (kind != "label" && kind != "annotation") || rest == "" {
		return Filter{}, fmt.Errorf("endpointslice filter %q: want all, label=<key>[=<value>] or annotation=<key>[=<value>]", s)
	}
	f := Filter{Kind: kind}
	f.Key, f.Value, f.HasValue = strings.Cut(rest, "=")
	if f.Key == "" {
		return Filter{}, fmt.Errorf("endpointslice filter %q: empty key", s)
	}
	return f, nil
}

func (f Filter) String() string {
	switch {
	case f.Kind == "" || f.Kind == "all":
		return "all"
	case f.HasValue:
		return f.Kind + "=" + f.Key + "=" + f.Value
	}
	return f.Kind + "=" + f.Key
}

func (f Filter) all() bool { return f.Kind == "" || f.Kind == "all" }

func (f Filter) matches(svc *corev1.Service) bool {
	m := svc.Labels
	if f.Kind == "annotation" {
		m = svc.Annotations
	}
	v, ok := m[f.Key]
	return ok && (!f.HasValue || v == f.Value)
}

// Config configures a Reporter.
type Config struct {
	ClusterName string
	// ClusterID is the registry id, when the agent knows it (the collector prefers the registry).
	ClusterID string
	Filter    Filter
	// SessionID identifies the agent process (the agent's session id); a new one per start.
	SessionID string
	// Resync republishes every slice and a marker this often even without changes (default
	// 10m), so a collector that lost a report, or a slice deleted while a tombstone could not
	// be sent, heals.
	Resync time.Duration
	// Parallel bounds concurrent publishes during a relist (default 16).
	Parallel int
	// TombstoneTTL is how long a deleted slice's tombstone stays in FLEET_AGENT (default
	// DefaultTombstoneTTL). A collector that was behind for longer misses it and drops the
	// slice at the next relist marker instead (within Resync).
	TombstoneTTL time.Duration
}

// DefaultTombstoneTTL bounds how long FLEET_AGENT keeps the tombstone of a deleted slice.
const DefaultTombstoneTTL = time.Hour

// relistKey is the work-queue item that means "report everything": it goes through the same
// queue as slice keys so that relists and single reports are serialized by one worker.
const relistKey = "\x00relist"

// Reporter reports EndpointSlices. Build it before the informer factory starts (it registers its
// informers there), then Run it once the caches have synced.
type Reporter struct {
	cfg    Config
	app    Appender
	log    *zap.Logger
	slices discoverylisters.EndpointSliceLister
	svcs   corelisters.ServiceLister
	synced []cache.InformerSynced
	queue  workqueue.TypedRateLimitingInterface[string]

	// Owned by the worker goroutine.
	gen      uint64
	reported map[string]bool // namespace/slice reported (and not tombstoned) in this session
	failing  bool

	mu sync.Mutex // guards gen for readers outside the worker (tests)
	// ttlWarn logs once that the stream refuses per-message TTLs.
	ttlWarn sync.Once
}

// New registers the informers the reporter needs with factory.
func New(cfg Config, factory informers.SharedInformerFactory, app Appender, log *zap.Logger) (*Reporter, error) {
	if cfg.ClusterName == "" {
		return nil, errors.New("endpointslices: cluster name is required")
	}
	if cfg.SessionID == "" {
		cfg.SessionID = uuid.NewString()
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	if cfg.TombstoneTTL <= 0 {
		cfg.TombstoneTTL = DefaultTombstoneTTL
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 16
	}
	if log == nil {
		log = zap.NewNop()
	}
	r := &Reporter{cfg: cfg, app: app, log: log.Named("endpointslices"), reported: map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "endpointslice-reporter"})}
	si := factory.Discovery().V1().EndpointSlices()
	r.slices = si.Lister()
	if _, err := si.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    r.enqueueSlice,
		UpdateFunc: func(_, obj any) { r.enqueueSlice(obj) },
		DeleteFunc: r.enqueueSlice,
	}); err != nil {
		return nil, fmt.Errorf("endpointslice informer: %w", err)
	}
	r.synced = append(r.synced, si.Informer().HasSynced)
	if !cfg.Filter.all() {
		// Selection is by the Service's labels or annotations: a change of them (re)selects or
		// drops every slice of the service.
		svc := factory.Core().V1().Services()
		r.svcs = svc.Lister()
		if _, err := svc.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    r.enqueueService,
			UpdateFunc: func(_, obj any) { r.enqueueService(obj) },
			DeleteFunc: r.enqueueService,
		}); err != nil {
			return nil, fmt.Errorf("service informer: %w", err)
		}
		r.synced = append(r.synced, svc.Informer().HasSynced)
	}
	return r, nil
}

func (r *Reporter) enqueueSlice(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err == nil {
		r.queue.Add(key)
	}
}

func (r *Reporter) enqueueService(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return
	}
	list, err := r.slices.EndpointSlices(svc.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
	if err != nil {
		return
	}
	for _, s := range list {
		r.queue.Add(s.Namespace + "/" + s.Name)
	}
}

// Run reports until ctx ends: a full relist first, then every change, a relist again every
// Resync and whenever publishing works again after failing (the hub may have missed reports).
func (r *Reporter) Run(ctx context.Context) error {
	defer r.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), r.synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("endpointslices: informer caches did not sync")
	}
	r.log.Info("reporting EndpointSlices", zap.String("filter", r.cfg.Filter.String()))
	r.queue.Add(relistKey)
	go func() {
		t := time.NewTicker(r.cfg.Resync)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				r.queue.ShutDown()
				return
			case <-t.C:
				r.queue.Add(relistKey)
			}
		}
	}()
	for {
		key, shutdown := r.queue.Get()
		if shutdown {
			return nil
		}
		err := r.process(ctx, key)
		switch {
		case err == nil:
			r.queue.Forget(key)
		case ctx.Err() != nil:
		default:
			if !r.failing {
				r.log.Warn("endpointslice report not published; retrying", zap.String("key", key), zap.Error(err))
			}
			r.failing = true
			r.queue.AddRateLimited(key)
		}
		r.queue.Done(key)
	}
}

func (r *Reporter) process(ctx context.Context, key string) error {
	if key == relistKey {
		if err := r.relist(ctx); err != nil {
			return err
		}
		r.failing = false
		return nil
	}
	if err := r.reportKey(ctx, key); err != nil {
		return err
	}
	if r.failing {
		// Publishing works again: whatever failed meanwhile may include tombstones the hub
		// never got, so report everything once more and mark it complete.
		r.failing = false
		r.log.Info("endpointslice reports published again; relisting")
		r.queue.Add(relistKey)
	}
	return nil
}

// reportKey publishes the slice at key as it is in the informer cache now: a snapshot if it is
// selected, a tombstone if it was reported and is gone or no longer selected.
func (r *Reporter) reportKey(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	s, err := r.slices.EndpointSlices(ns).Get(name)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get endpointslice %s: %w", key, err)
	}
	if err == nil && r.selected(s) {
		if err := r.publish(ctx, r.report(s)); err != nil {
			return err
		}
		r.reported[key] = true
		return nil
	}
	if !r.reported[key] {
		return nil
	}
	svc := ""
	if s != nil {
		svc = s.Labels[discoveryv1.LabelServiceName]
	}
	if err := r.publishAs(ctx, events.Any.ExpiresAfter(r.cfg.TombstoneTTL), &endpointv1.EndpointSliceReport{ClusterName: r.cfg.ClusterName, ClusterId: r.cfg.ClusterID,
		Namespace: ns, Slice: name, Service: svc, Deleted: true, SessionId: r.cfg.SessionID, Generation: r.generation(),
		Time: timestamppb.Now()}); err != nil {
		return err
	}
	delete(r.reported, key)
	return nil
}

// relist reports every selected slice under a new generation, then the marker. If a publish
// fails the relist is retried whole, with a new generation again.
func (r *Reporter) relist(ctx context.Context) error {
	r.mu.Lock()
	r.gen++
	r.mu.Unlock()
	all, err := r.slices.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list endpointslices: %w", err)
	}
	reported := make(map[string]bool, len(all))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.cfg.Parallel)
	for _, s := range all {
		if !r.selected(s) {
			continue
		}
		g.Go(func() error {
			if err := r.publish(gctx, r.report(s)); err != nil {
				return err
			}
			mu.Lock()
			reported[s.Namespace+"/"+s.Name] = true
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("relist: %w", err)
	}
	if err := r.publishSync(ctx, len(reported)); err != nil {
		return err
	}
	r.reported = reported
	r.log.Debug("endpointslice relist complete", zap.Uint64("generation", r.generation()), zap.Int("slices", len(reported)))
	return nil
}

func (r *Reporter) generation() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gen
}

func (r *Reporter) selected(s *discoveryv1.EndpointSlice) bool {
	svc := s.Labels[discoveryv1.LabelServiceName]
	if svc == "" {
		return false
	}
	if r.cfg.Filter.all() {
		return true
	}
	obj, err := r.svcs.Services(s.Namespace).Get(svc)
	return err == nil && r.cfg.Filter.matches(obj)
}

// report converts a slice, normalizing its conditions as the EndpointSlice API defines them:
// an unknown `ready` means ready, an unknown `serving` means the same as ready.
func (r *Reporter) report(s *discoveryv1.EndpointSlice) *endpointv1.EndpointSliceReport {
	out := &endpointv1.EndpointSliceReport{
		ClusterName: r.cfg.ClusterName, ClusterId: r.cfg.ClusterID,
		Namespace: s.Namespace, Service: s.Labels[discoveryv1.LabelServiceName], Slice: s.Name,
		AddressType: string(s.AddressType), SessionId: r.cfg.SessionID, Generation: r.generation(),
		SliceUid: string(s.UID), ResourceVersion: s.ResourceVersion, Time: timestamppb.Now(),
		Ports:     make([]*endpointv1.EndpointPort, 0, len(s.Ports)),
		Endpoints: make([]*endpointv1.Endpoint, 0, len(s.Endpoints)),
	}
	for _, p := range s.Ports {
		ep := &endpointv1.EndpointPort{Protocol: "TCP"}
		if p.Name != nil {
			ep.Name = *p.Name
		}
		if p.Port != nil {
			ep.Port = uint32(*p.Port)
		}
		if p.Protocol != nil {
			ep.Protocol = string(*p.Protocol)
		}
		if p.AppProtocol != nil {
			ep.AppProtocol = *p.AppProtocol
		}
		out.Ports = append(out.Ports, ep)
	}
	for _, e := range s.Endpoints {
		ready := e.Conditions.Ready == nil || *e.Conditions.Ready
		serving := ready
		if e.Conditions.Serving != nil {
			serving = *e.Conditions.Serving
		}
		x := &endpointv1.Endpoint{Addresses: e.Addresses, Ready: ready, Serving: serving,
			Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating}
		if e.Zone != nil {
			x.Zone = *e.Zone
		}
		if e.NodeName != nil {
			x.Node = *e.NodeName
		}
		if e.Hostname != nil {
			x.Hostname = *e.Hostname
		}
		if t := e.TargetRef; t != nil {
			x.Target = &endpointv1.TargetRef{Kind: t.Kind, Namespace: t.Namespace, Name: t.Name, Uid: string(t.UID)}
		}
		out.Endpoints = append(out.Endpoints, x)
	}
	return out
}

const publishTimeout = 10 * time.Second

func (r *Reporter) publish(ctx context.Context, m *endpointv1.EndpointSliceReport) error {
	return r.publishAs(ctx, events.Any, m)
}

func (r *Reporter) publishAs(ctx context.Context, expect events.Expect, m *endpointv1.EndpointSliceReport) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	subject := subjects.AgentEndpointSlice(r.cfg.ClusterName, m.Namespace, m.Slice)
	// No events.Command: a report is a snapshot of one slice, the latest wins (FLEET_AGENT keeps one per subject).
	_, err := r.app.Append(ctx, subject, r.cfg.ClusterName, expect, m)
	if err != nil && expect.TTL() > 0 && events.IsTTLDisabled(err) {
		// The hub that created FLEET_AGENT predates per-message TTLs: report the deletion
		// without one (it then stays until a later report of the slice replaces it) rather than
		// retry a refusal that will not change until the hub is upgraded.
		r.ttlWarn.Do(func() {
			r.log.Warn("FLEET_AGENT does not allow per-message TTLs (upgrade the hub); deleted slices' reports are kept", zap.Error(err))
		})
		_, err = r.app.Append(ctx, subject, r.cfg.ClusterName, expect.ExpiresAfter(0), m)
	}
	if err != nil {
		return fmt.Errorf("report endpointslice %s/%s: %w", m.Namespace, m.Slice, err)
	}
	return nil
}

func (r *Reporter) publishSync(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	_, err := r.app.Append(ctx, subjects.AgentEndpointSync(r.cfg.ClusterName), r.cfg.ClusterName, events.Any,
		&endpointv1.EndpointSliceSync{ClusterName: r.cfg.ClusterName, SessionId: r.cfg.SessionID, Generation: r.generation(),
			SliceCount: uint32(n), Time: timestamppb.Now()})
	if err != nil {
		return fmt.Errorf("report endpointslice relist marker: %w", err)
	}
	return nil
}
