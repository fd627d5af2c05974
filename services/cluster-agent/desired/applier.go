// Package desired is the member cluster's desired-state applier: it watches this cluster's keys
// of every desired bucket, applies each DesiredObject with server-side apply, deletes or
// releases tombstoned objects, repairs drift seen by label-filtered informers, prunes managed
// objects whose key disappeared, and reports what it did into the applied bucket.
//
// The model is kubernetes/sample-controller: event sources (bucket watches, informers, a resync
// timer) only enqueue `<bucket>/<key>`; workers reconcile a key from the latest desired entry
// and the live object, so every path converges on the same result however events interleave.
package desired

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/workqueue"

	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// reconcileTimeout bounds one key's reconcile, so a hung API call delays one key, not a worker
// forever.
const reconcileTimeout = time.Minute

// Applier applies one member cluster's desired state. Create it with New, run it with Run.
type Applier struct {
	cfg       Config
	js        jetstream.JetStream
	dyn       dynamic.Interface
	log       *zap.Logger
	keyPrefix string // the encoded cluster token every key of this cluster starts with
	buckets   []string

	store     *store
	resolver  *resolver
	informers *informerSet
	status    *reporter
	queue     workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	started bool
	// applied remembers, per key, the desired revision and the resourceVersion our last apply
	// produced: the informer event our own write causes then costs no second apply.
	applied map[string]appliedMark
}

type appliedMark struct {
	desiredRevision uint64
	resourceVersion string
}

// New returns an applier of cfg.ClusterName's desired state, read through js and applied with
// dyn; disc maps kinds to resources.
func New(cfg Config, js jetstream.JetStream, dyn dynamic.Interface, disc discovery.DiscoveryInterface, log *zap.Logger) (*Applier, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("desired applier config: %w", err)
	}
	if js == nil || dyn == nil || disc == nil {
		return nil, errors.New("desired applier: jetstream, dynamic and discovery clients are required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	log = log.Named("desired").With(zap.String("cluster", cfg.ClusterName))
	a := &Applier{
		cfg:       cfg,
		js:        js,
		dyn:       dyn,
		log:       log,
		keyPrefix: keys.Encode(cfg.ClusterName),
		buckets:   subjects.DesiredBuckets(),
		store:     newStore(),
		resolver:  newResolver(disc),
		status:    newReporter(js, log),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "desired-" + cfg.ClusterName},
		),
		applied: map[string]appliedMark{},
	}
	a.informers = newInformerSet(dyn, a.onObjectEvent)
	return a, nil
}

// Run watches, applies and reports until ctx ends; it returns nil then. Failures of the hub or
// the member cluster are retried, never returned.
func (a *Applier) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.started {
		a.mu.Unlock()
		return errors.New("desired applier: Run called twice")
	}
	a.started = true
	a.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.informers.start(ctx)

	var wg sync.WaitGroup
	// Informers of the known kinds start now, so that drift on them is seen from the start;
	// each sweep makes sure they run before it prunes.
	wg.Go(func() { a.startKnownInformers(ctx) })
	for _, b := range a.buckets {
		wg.Go(func() { a.watchBucket(ctx, b) })
	}
	for range a.cfg.Workers {
		wg.Go(func() {
			for a.processNext(ctx) {
			}
		})
	}
	wg.Go(func() { a.resyncLoop(ctx) })
	a.log.Info("desired applier running", zap.Strings("buckets", a.buckets), zap.Int("workers", a.cfg.Workers))

	<-ctx.Done()
	a.queue.ShutDown()
	wg.Wait()
	a.informers.wait()
	return nil
}

// processNext reconciles one queued key; false when the queue shut down.
func (a *Applier) processNext(ctx context.Context) bool {
	qk, shutdown := a.queue.Get()
	if shutdown {
		return false
	}
	defer a.queue.Done(qk)
	rctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
	err := a.reconcile(rctx, qk)
	cancel()
	if err == nil {
		a.queue.Forget(qk)
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	a.log.Info("reconcile failed; retrying", zap.String("key", qk), zap.Int("retries", a.queue.NumRequeues(qk)), zap.Error(err))
	a.queue.AddRateLimited(qk)
	return true
}

// onObjectEvent queues the desired key of a managed object that changed or disappeared.
func (a *Applier) onObjectEvent(obj any) {
	qk := desiredKeyOf(obj)
	if a.ours(qk) {
		a.queue.Add(qk)
	}
	a.namespaceChanged(obj)
}

// ours reports whether qk is a key of one of our buckets under this cluster: another cluster's
// annotation (the same Kubernetes cluster registered twice) is not ours to act on.
func (a *Applier) ours(qk string) bool {
	bucket, key, ok := splitQueueKey(qk)
	if !ok || !strings.HasPrefix(key, a.keyPrefix+".") {
		return false
	}
	for _, b := range a.buckets {
		if b == bucket {
			return true
		}
	}
	return false
}

// startKnownInformers starts the informers of knownKinds, retrying until they run.
func (a *Applier) startKnownInformers(ctx context.Context) {
	delay := watchRetryBase
	for {
		err := a.ensureKnownInformers(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		a.log.Warn("informers of known kinds not running; retrying", zap.Duration("in", delay), zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, watchRetryMax)
	}
}

func (a *Applier) ensureKnownInformers(ctx context.Context) error {
	var errs []error
	for _, gvk := range knownKinds() {
		m, err := a.resolver.mapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			err = a.informers.ensure(ctx, m.Resource)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// resyncLoop periodically re-reconciles every desired key and re-runs prune.
func (a *Applier) resyncLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.ResyncPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, e := range a.store.list("") {
			a.queue.Add(queueKey(e.bucket, e.key))
		}
		for _, b := range a.store.syncedBuckets() {
			a.queue.Add(queueKey(b, sweepKey))
		}
	}
}
