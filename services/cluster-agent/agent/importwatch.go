package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/kvfeed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Defaults of ImportWatchConfig.
const (
	DefaultSecretResend = 30 * time.Second
	// envelopeHeadroom is left in a NATS message for the event envelope and its headers.
	envelopeHeadroom = 16 << 10
	// importReconcileEvery re-resolves types whose version could not be found yet (a CRD
	// installed after the policy) and is otherwise a no-op.
	importReconcileEvery = 10 * time.Second
)

// ImportWatchConfig configures an ImportWatcher.
type ImportWatchConfig struct {
	// SecretResend is how often every wanted Secret is sent again (default 30s). Secrets travel
	// on core NATS and the hub keeps them only in memory, so a restarted hub has them back
	// within this period.
	SecretResend time.Duration
	// MaxObjectBytes bounds an object's JSON; a larger one is reported as too_large. Default:
	// the server's max payload less room for the envelope.
	MaxObjectBytes int
}

// ImportWatcher reports the objects import policies need from this cluster: it reads this
// cluster's key of the import-watch bucket (written by cluster-import) and runs one dynamic
// informer per watched type and namespace.
type ImportWatcher struct {
	a      *Agent
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	cfg    ImportWatchConfig
	log    *zap.Logger
	q      workqueue.TypedRateLimitingInterface[importItem]

	mu        sync.Mutex
	informers map[informerKey]*importInformer
	// wanted references, by object.
	wanted map[objectKey]*agentv1.WatchedObject
	spec   *agentv1.ImportWatch

	// published holds, per object, the informer run and resourceVersion last reported (rv ""
	// = reported deleted). Only the worker touches it.
	published map[objectKey]reported
	starts    int
	// status is what the agent reports about each watched type (importstatus.go).
	status *importStatus
}

type informerKey struct {
	source                     bool
	group, resource, namespace string
}

type objectKey struct{ group, resource, namespace, name string }

type reported struct{ gen, rv string }

type importInformer struct {
	key     informerKey
	version string
	// gen names this informer's run (session and start), sent with its reports and sync
	// marker: a restarted informer's marker supersedes what an earlier run reported.
	gen      string
	informer cache.SharedIndexInformer
	stop     context.CancelFunc
}

type itemKind int

const (
	itemObject itemKind = iota
	// itemSync reports every object of a source informer, then the ImportSync marker.
	itemSync
	// itemResend sends every wanted Secret again.
	itemResend
	// itemForget drops the published records of a stopped informer (published is the
	// worker's alone).
	itemForget
)

type importItem struct {
	kind itemKind
	inf  informerKey
	obj  objectKey
	// force sends even if the same resourceVersion was already sent (Secrets' periodic resend).
	force bool
}

// NewImportWatcher returns the import source reporter of a; add it with a.Add.
func NewImportWatcher(a *Agent, dyn dynamic.Interface, disc discovery.DiscoveryInterface, cfg ImportWatchConfig) *ImportWatcher {
	if cfg.SecretResend <= 0 {
		cfg.SecretResend = DefaultSecretResend
	}
	return &ImportWatcher{
		a:         a,
		dyn:       dyn,
		mapper:    restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)),
		cfg:       cfg,
		log:       a.log.Named("import"),
		informers: map[informerKey]*importInformer{},
		wanted:    map[objectKey]*agentv1.WatchedObject{},
		published: map[objectKey]reported{},
		status:    newImportStatus(),
	}
}

func isSecret(group, resource string) bool { return group == "" && resource == "secrets" }

// Run watches the spec and reports until ctx ends.
func (w *ImportWatcher) Run(ctx context.Context) error {
	w.q = workqueue.NewTypedRateLimitingQueue(
		workqueue.NewTypedItemExponentialFailureRateLimiter[importItem](inventoryRetryBase, inventoryRetryMax))
	defer w.q.ShutDown()
	defer w.stopAll()
	if w.cfg.MaxObjectBytes <= 0 {
		w.cfg.MaxObjectBytes = int(w.a.js.Conn().MaxPayload()) - envelopeHeadroom
	}
	specs := make(chan *agentv1.ImportWatch, 1)
	go w.watchSpec(ctx, specs)
	go func() {
		<-ctx.Done()
		w.q.ShutDown()
	}()
	go w.work(ctx)
	go w.reportStatus(ctx)

	resend := time.NewTicker(w.cfg.SecretResend)
	defer resend.Stop()
	retry := time.NewTicker(importReconcileEvery)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case spec := <-specs:
			w.reconcile(ctx, spec)
		case <-retry.C:
			w.reconcile(ctx, nil)
		case <-resend.C:
			w.q.Add(importItem{kind: itemResend})
		}
	}
}

// watchSpec sends every value of this cluster's import-watch key (an empty spec when it is
// deleted), re-establishing the watch when it fails.
func (w *ImportWatcher) watchSpec(ctx context.Context, out chan *agentv1.ImportWatch) {
	send := func(s *agentv1.ImportWatch) {
		// Only the latest spec matters: replace one not yet taken.
		select {
		case <-out:
		default:
		}
		out <- s
	}
	key := subjects.ImportWatchKey(w.a.cfg.ClusterName)
	// A watch that ended is resumed, keeping its subscription (pkg/kvfeed).
	var kw *kvfeed.Watcher
	defer func() {
		if kw != nil {
			_ = kw.Stop()
		}
	}()
	delay := watchRetryBase
	for ctx.Err() == nil {
		started := time.Now()
		err := func() error {
			var err error
			if kw != nil {
				kw, err = kw.Resume(ctx)
			} else {
				kw, err = kvfeed.Watch(ctx, w.a.js, subjects.ImportWatchBucket, key, kvfeed.Options{Resync: feedResync})
			}
			if err != nil {
				return err
			}
			for e := range kw.Updates() {
				if e == nil {
					delay = watchRetryBase
					continue
				}
				spec := &agentv1.ImportWatch{}
				if e.Operation() == jetstream.KeyValuePut {
					if err := proto.Unmarshal(e.Value(), spec); err != nil {
						w.log.Error("undecodable import watch spec; ignoring it", zap.Error(err))
						continue
					}
				}
				send(spec)
			}
			if err := kw.Err(); err != nil {
				return err
			}
			return errors.New("import watch ended")
		}()
		if ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, kvfeed.ErrResync) && time.Since(started) > watchRetryMax:
			// The replay resends the spec; the informers are kept when it is unchanged.
			w.log.Info("import watch spec resyncing", zap.Error(err))
			continue
		case errors.Is(err, jetstream.ErrBucketNotFound):
			w.log.Debug("import-watch bucket does not exist yet")
		default:
			w.log.Warn("import watch spec unavailable; retrying", zap.Duration("in", delay), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, watchRetryMax)
	}
}

const (
	watchRetryBase = 250 * time.Millisecond
	watchRetryMax  = 5 * time.Second
	// feedResync is how often the spec is replayed even though nothing suggested a missed
	// change (pkg/kvfeed).
	feedResync = 15 * time.Minute
)

// reconcile starts and stops informers to match spec (the last one when nil).
func (w *ImportWatcher) reconcile(ctx context.Context, spec *agentv1.ImportWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if spec != nil {
		w.spec = spec
		// Every session reports once it has a spec, replacing an earlier session's report.
		w.status.poke()
	}
	if w.spec == nil {
		return
	}
	want := map[informerKey]string{}
	for _, s := range w.spec.GetSources() {
		if isSecret(s.GetGroup(), s.GetResource()) {
			// A Secret source would have to be persisted to be replayed; refused.
			w.log.Error("Secrets cannot be an import source; ignoring", zap.String("namespace", s.GetNamespace()))
			continue
		}
		want[informerKey{source: true, group: s.GetGroup(), resource: s.GetResource(), namespace: s.GetNamespace()}] = s.GetVersion()
	}
	wanted := map[objectKey]*agentv1.WatchedObject{}
	for _, r := range w.spec.GetReferences() {
		wanted[objectKey{r.GetGroup(), r.GetResource(), r.GetNamespace(), r.GetName()}] = r
		// An object of a watched source type is reported by the source's informer already; a
		// second informer's reports would carry another run's generation, and the source's
		// sync marker would then count them as gone.
		_, all := want[informerKey{source: true, group: r.GetGroup(), resource: r.GetResource()}]
		_, ns := want[informerKey{source: true, group: r.GetGroup(), resource: r.GetResource(), namespace: r.GetNamespace()}]
		if all || ns {
			continue
		}
		want[informerKey{group: r.GetGroup(), resource: r.GetResource(), namespace: r.GetNamespace()}] = r.GetVersion()
	}
	w.status.keep(want)
	for k, inf := range w.informers {
		if _, ok := want[k]; !ok {
			w.stopLocked(k, inf)
			w.log.Info("stopped watching import objects", zap.String("group", k.group), zap.String("resource", k.resource), zap.String("namespace", k.namespace))
		}
	}
	// Newly wanted references of running informers are reported now; new informers report
	// theirs once synced.
	for ok, r := range wanted {
		if _, had := w.wanted[ok]; had {
			continue
		}
		ik := informerKey{group: r.GetGroup(), resource: r.GetResource(), namespace: r.GetNamespace()}
		if _, running := w.informers[ik]; running {
			w.q.Add(importItem{kind: itemObject, inf: ik, obj: ok})
		}
	}
	w.wanted = wanted
	for k, version := range want {
		if _, ok := w.informers[k]; ok {
			continue
		}
		if err := w.start(ctx, k, version); err != nil {
			w.status.failed(k, "", true, err)
			w.log.Warn("cannot watch import objects yet; retrying", zap.String("group", k.group), zap.String("resource", k.resource), zap.Error(err))
		}
	}
}

func (w *ImportWatcher) start(ctx context.Context, k informerKey, version string) error {
	gvr := schema.GroupVersionResource{Group: k.group, Version: version, Resource: k.resource}
	if version == "" {
		var err error
		gvr, err = w.mapper.ResourceFor(schema.GroupVersionResource{Group: k.group, Resource: k.resource})
		if err != nil {
			// The type may have been installed since discovery was cached.
			w.mapper.Reset()
			return fmt.Errorf("resolve %s.%s: %w", k.resource, k.group, err)
		}
	}
	ictx, stop := context.WithCancel(ctx)
	w.starts++
	gen := fmt.Sprintf("%s-%d", w.a.sessionID, w.starts)
	informer := w.newInformer(gvr, k, gen)
	enqueue := func(obj any) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			return
		}
		ok := objectKey{k.group, k.resource, ns, name}
		if !k.source {
			w.mu.Lock()
			_, wanted := w.wanted[ok]
			w.mu.Unlock()
			if !wanted {
				return
			}
		}
		w.q.Add(importItem{kind: itemObject, inf: k, obj: ok})
	}
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, n any) { enqueue(n) },
		DeleteFunc: enqueue,
	})
	if err != nil {
		stop()
		return fmt.Errorf("watch %s: %w", gvr, err)
	}
	w.status.update(k, gen, true, func(t *typeStatus) { t.version, t.reason, t.message, t.synced = gvr.Version, "", "", false })
	w.informers[k] = &importInformer{key: k, version: gvr.Version, gen: gen, informer: informer, stop: stop}
	go informer.RunWithContext(ictx)
	go func() {
		if !cache.WaitForCacheSync(ictx.Done(), reg.HasSynced) {
			return
		}
		w.status.update(k, gen, false, func(t *typeStatus) { t.synced = true })
		if k.source {
			w.q.Add(importItem{kind: itemSync, inf: k})
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		for ok := range w.wanted {
			if ok.group == k.group && ok.resource == k.resource && ok.namespace == k.namespace {
				w.q.Add(importItem{kind: itemObject, inf: k, obj: ok})
			}
		}
	}()
	w.log.Info("watching import objects", zap.Stringer("gvr", gvr), zap.String("namespace", k.namespace), zap.Bool("source", k.source))
	return nil
}

func (w *ImportWatcher) stopAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, inf := range w.informers {
		w.stopLocked(k, inf)
	}
}

// stopLocked stops an informer and forgets what it reported, so that a later run reports
// everything again under its own generation.
func (w *ImportWatcher) stopLocked(k informerKey, inf *importInformer) {
	inf.stop()
	delete(w.informers, k)
	w.q.Add(importItem{kind: itemForget, inf: k})
}

func (w *ImportWatcher) work(ctx context.Context) {
	for {
		it, shutdown := w.q.Get()
		if shutdown {
			return
		}
		err := w.process(ctx, it)
		switch {
		case err == nil:
			w.q.Forget(it)
		case ctx.Err() != nil:
		default:
			w.log.Warn("import object not reported; retrying", zap.String("resource", it.inf.resource), zap.String("namespace", it.obj.namespace), zap.String("name", it.obj.name), zap.Error(err))
			w.q.AddRateLimited(it)
		}
		w.q.Done(it)
	}
}

func (w *ImportWatcher) process(ctx context.Context, it importItem) error {
	switch it.kind {
	case itemForget:
		w.mu.Lock()
		cur, restarted := w.informers[it.inf]
		w.mu.Unlock()
		for ok, r := range w.published {
			if ok.group == it.inf.group && ok.resource == it.inf.resource && (it.inf.namespace == "" || ok.namespace == it.inf.namespace) &&
				(!restarted || r.gen != cur.gen) {
				delete(w.published, ok)
			}
		}
		return nil
	case itemResend:
		w.mu.Lock()
		var secrets []objectKey
		for ok := range w.wanted {
			if isSecret(ok.group, ok.resource) {
				secrets = append(secrets, ok)
			}
		}
		w.mu.Unlock()
		for _, ok := range secrets {
			w.q.Add(importItem{kind: itemObject, inf: informerKey{group: ok.group, resource: ok.resource, namespace: ok.namespace}, obj: ok, force: true})
		}
		return nil
	case itemSync:
		w.mu.Lock()
		inf, ok := w.informers[it.inf]
		w.mu.Unlock()
		if !ok {
			return nil
		}
		objs := inf.informer.GetStore().List()
		names := make([]objectKey, 0, len(objs))
		for _, o := range objs {
			if u, isU := o.(*unstructured.Unstructured); isU {
				names = append(names, objectKey{it.inf.group, it.inf.resource, u.GetNamespace(), u.GetName()})
			}
		}
		slices.SortFunc(names, func(a, b objectKey) int {
			return cmpStrings(a.namespace+"/"+a.name, b.namespace+"/"+b.name)
		})
		for _, ok := range names {
			if err := w.report(ctx, inf, ok, false); err != nil {
				return err
			}
		}
		c := w.a.cfg.ClusterName
		return w.a.appendReport(ctx, subjects.AgentImportSync(c, it.inf.group, it.inf.resource, it.inf.namespace), &agentv1.ImportSync{
			ClusterName: c, Group: it.inf.group, Version: inf.version, Resource: it.inf.resource,
			Namespace: it.inf.namespace, SessionId: inf.gen, Time: timestamppb.Now(),
		})
	default:
		w.mu.Lock()
		inf, ok := w.informers[it.inf]
		_, wanted := w.wanted[it.obj]
		w.mu.Unlock()
		if !ok || (!it.inf.source && !wanted) {
			return nil
		}
		return w.report(ctx, inf, it.obj, it.force)
	}
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// report sends the cached state of one object unless it was already sent.
func (w *ImportWatcher) report(ctx context.Context, inf *importInformer, ok objectKey, force bool) error {
	key := ok.name
	if ok.namespace != "" {
		key = ok.namespace + "/" + ok.name
	}
	obj, exists, err := inf.informer.GetStore().GetByKey(key)
	if err != nil {
		return fmt.Errorf("read %s %s from cache: %w", ok.resource, key, err)
	}
	c := w.a.cfg.ClusterName
	msg := &agentv1.ImportObject{
		ClusterName: c, Group: ok.group, Version: inf.version, Resource: ok.resource,
		Namespace: ok.namespace, Name: ok.name, SessionId: inf.gen, Time: timestamppb.Now(),
	}
	last, sent := w.published[ok]
	sent = sent && last.gen == inf.gen
	rv := ""
	if exists {
		u, isU := obj.(*unstructured.Unstructured)
		if !isU {
			return fmt.Errorf("%s %s: unexpected %T in cache", ok.resource, key, obj)
		}
		rv = u.GetResourceVersion()
		if sent && last.rv == rv && !force {
			return nil
		}
		u = u.DeepCopy()
		// Managed fields are bookkeeping no template needs, and often half the object.
		unstructured.RemoveNestedField(u.Object, "metadata", "managedFields")
		data, err := u.MarshalJSON()
		if err != nil {
			return fmt.Errorf("encode %s %s: %w", ok.resource, key, err)
		}
		if len(data) > w.cfg.MaxObjectBytes {
			// Never the content: it may be a Secret.
			w.log.Error("import object too large to report", zap.String("resource", ok.resource), zap.String("namespace", ok.namespace), zap.String("name", ok.name), zap.Int("bytes", len(data)), zap.Int("max", w.cfg.MaxObjectBytes))
			msg.TooLarge = true
		} else {
			msg.Object = data
		}
	} else {
		// A source never reported in this session needs no tombstone (the sync marker covers
		// it); a wanted reference does: the hub must learn it does not exist.
		if (sent && last.rv == "" && !force) || (!sent && inf.key.source) {
			return nil
		}
		msg.Deleted = true
	}
	if isSecret(ok.group, ok.resource) {
		data, err := proto.Marshal(msg)
		if err != nil {
			return fmt.Errorf("encode secret report %s: %w", key, err)
		}
		if err := w.a.js.Conn().Publish(subjects.AgentSecret(c, ok.namespace, ok.name), data); err != nil {
			return fmt.Errorf("send secret %s: %w", key, err)
		}
	} else if err := w.a.appendReport(ctx, subjects.AgentImportObject(c, ok.group, ok.resource, ok.namespace, ok.name), msg); err != nil {
		return err
	}
	w.published[ok] = reported{gen: inf.gen, rv: rv}
	return nil
}
