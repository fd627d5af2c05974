// Package reconcile is the shape of every hub loop, after kubernetes/sample-controller: changes
// of view caches queue the keys they touch on client-go's rate-limited workqueue, and workers
// reconcile one key at a time against the caches as they are then.
//
//   - A key queued several times before a worker takes it is reconciled once, and a key is never
//     reconciled by two workers at once.
//   - A failed key is queued again with a per-key exponential backoff; the other keys go on. A
//     key reconciled successfully has its backoff forgotten.
//   - Every key (Config.Keys) is queued at the start and every Config.Resync, so whatever a
//     change missed (a failure with no change to follow it, a subscription cut off) is looked at
//     again.
//   - A source wrapped in Delay queues its keys only once a delay has passed since the change,
//     so a busy cache's changes (a fleet joining) cost one reconcile per delay, not one each.
//   - The queue's own metrics (depth, latency, work time, retries) are exported per queue
//     (Collectors).
//   - RunLeased runs controllers only while this replica holds a lease (pkg/lease): one writer
//     among the replicas.
//
// Reconcilers must be idempotent: a key may be reconciled with nothing to do, and again after a
// failure that left part of its work done.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/util/workqueue"

	"github.com/fleetstream/fleetstream/pkg/lease"
)

// Reconciler brings what key names in line with the caches it reads. An error queues the key
// again, after a backoff that grows with its consecutive failures.
type Reconciler interface {
	Reconcile(ctx context.Context, key string) error
}

// Func adapts a function to Reconciler.
type Func func(ctx context.Context, key string) error

// Reconcile calls f.
func (f Func) Reconcile(ctx context.Context, key string) error { return f(ctx, key) }

// Config tunes a Controller.
type Config struct {
	// Name names the queue in logs and metrics (label name); unique within a process.
	Name string
	// Keys lists every key, queued at the start, every Resync and whenever a source was cut off.
	// Nil: only changes queue keys.
	Keys func() []string
	// Resync is how often every key is queued (0: never, after the start).
	Resync time.Duration
	// Workers reconcile keys concurrently (default 1).
	Workers int
	// BaseDelay and MaxDelay bound a failing key's backoff: BaseDelay after its first failure,
	// doubling with each further one up to MaxDelay (defaults 10 ms and 30 s).
	BaseDelay, MaxDelay time.Duration
	// Timeout bounds one reconcile (0: none).
	Timeout time.Duration
	// Log receives failed reconciles.
	Log *zap.Logger
}

// Controller queues keys from its sources and reconciles them.
type Controller struct {
	cfg     Config
	r       Reconciler
	metrics *metrics

	mu sync.Mutex
	// q is the queue of the current Run; nil when not running (Add then drops keys: whoever
	// runs next queues every key at its start).
	q       workqueue.TypedRateLimitingInterface[string]
	running chan struct{} // closed when a Run has started; replaced when it ends
	// added are the keys added and not yet taken by a worker, busy the reconciles in
	// progress: Sync waits until both are empty.
	added map[string]struct{}
	busy  int
	idle  chan struct{} // closed when added and busy become empty; replaced after
}

// New returns a controller that reconciles keys with r; Run gives it its sources. Its metrics
// exist from now on, for the caller to register before it runs.
func New(cfg Config, r Reconciler) *Controller {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.BaseDelay <= 0 {
		cfg.BaseDelay = 10 * time.Millisecond
	}
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = 30 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	cfg.Log = cfg.Log.With(zap.String("queue", cfg.Name))
	return &Controller{cfg: cfg, r: r, metrics: newMetrics(cfg.Name),
		running: make(chan struct{}), added: map[string]struct{}{}, idle: closedChan()}
}

func closedChan() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// Run reconciles the keys sources queue (and every key, at the start and each Resync) until ctx
// ends. It may be called again after it returned (a lease regained), with a fresh queue; never
// twice at once.
func (c *Controller) Run(ctx context.Context, sources ...Source) error {
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](c.cfg.BaseDelay, c.cfg.MaxDelay),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: c.cfg.Name, MetricsProvider: c.metrics})
	c.mu.Lock()
	if c.q != nil {
		c.mu.Unlock()
		q.ShutDown()
		return fmt.Errorf("reconcile %s: already running", c.cfg.Name)
	}
	c.q = q
	c.added, c.busy, c.idle = map[string]struct{}{}, 0, closedChan()
	running := c.running
	c.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var workers sync.WaitGroup
	for range c.cfg.Workers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for c.processNext(ctx, q) {
			}
		}()
	}
	defer func() {
		c.mu.Lock()
		c.q = nil
		c.running = make(chan struct{})
		c.track(func() { c.added, c.busy = map[string]struct{}{}, 0 })
		c.mu.Unlock()
		q.ShutDown()
		workers.Wait()
		// What the dropped queue held is no longer waiting; the next run starts from none.
		c.metrics.depth.Set(0)
	}()

	g, gctx := errgroup.WithContext(ctx)
	for _, s := range sources {
		feed := s.subscribe(gctx)
		g.Go(func() error { feed(c, c.resync); return nil })
	}
	c.resync()
	// Only now may Sync count on the run: had it queued its keys before the start did, the
	// start's queueing could come after Sync's wait and reconcile a key once more.
	close(running)
	if c.cfg.Resync > 0 {
		g.Go(func() error {
			t := time.NewTicker(c.cfg.Resync)
			defer t.Stop()
			for {
				select {
				case <-gctx.Done():
					return nil
				case <-t.C:
					c.resync()
				}
			}
		})
	}
	<-ctx.Done()
	return g.Wait()
}

// Add queues key now, if the controller runs.
func (c *Controller) Add(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.q == nil {
		return
	}
	c.track(func() { c.added[key] = struct{}{} })
	c.q.Add(key)
}

// AddAfter queues key once d has passed (a reconciler asking to be called again at a known
// moment), if the controller still runs then.
func (c *Controller) AddAfter(key string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.q != nil {
		c.q.AddAfter(key, d)
	}
}

// track applies change to added and busy, and keeps idle in step. c.mu must be held.
func (c *Controller) track(change func()) {
	was := len(c.added) == 0 && c.busy == 0
	change()
	is := len(c.added) == 0 && c.busy == 0
	switch {
	case was && !is:
		c.idle = make(chan struct{})
	case !was && is:
		close(c.idle)
	}
}

func (c *Controller) resync() {
	if c.cfg.Keys == nil {
		return
	}
	for _, k := range c.cfg.Keys() {
		c.Add(k)
	}
}

// processNext reconciles one key; false once the queue is shut down.
func (c *Controller) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	key, shutdown := q.Get()
	if shutdown {
		return false
	}
	c.mu.Lock()
	if c.q == q {
		c.track(func() { delete(c.added, key); c.busy++ })
	}
	c.mu.Unlock()
	err := c.reconcile(ctx, key)
	switch {
	case err == nil:
		q.Forget(key)
	case ctx.Err() != nil:
	default:
		c.cfg.Log.Warn("reconcile failed; retried", zap.String("key", key), zap.Int("retries", q.NumRequeues(key)), zap.Error(err))
		c.metrics.retries.Inc()
		q.AddRateLimited(key)
	}
	q.Done(key)
	c.mu.Lock()
	if c.q == q {
		c.track(func() { c.busy-- })
	}
	c.mu.Unlock()
	return true
}

func (c *Controller) reconcile(ctx context.Context, key string) (err error) {
	if c.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("reconcile %s: panic: %v", key, p)
		}
	}()
	return c.r.Reconcile(ctx, key)
}

// Sync queues every key and waits until each has been reconciled since (or failed and waits for
// its retry): whatever the caches, as they were when Sync was called, make the reconciler do
// has then been done. Tests use it before asserting that something did not happen. While the
// controller does not run (another replica holds its lease), Sync waits until it does.
func (c *Controller) Sync(ctx context.Context) error {
	for {
		c.mu.Lock()
		running := c.running
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("sync %s: not running: %w", c.cfg.Name, ctx.Err())
		case <-running:
		}
		c.resync()
		c.mu.Lock()
		idle, stillRunning := c.idle, c.q != nil
		c.mu.Unlock()
		if !stillRunning {
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sync %s: %w", c.cfg.Name, ctx.Err())
		case <-idle:
		}
		c.mu.Lock()
		stillRunning = c.q != nil
		c.mu.Unlock()
		if stillRunning {
			return nil
		}
		// The run ended under us: its keys were dropped, not reconciled.
	}
}

// RunLeased runs each of runs (a controller's Run with its sources, typically) while this
// replica holds lease name, until ctx ends: when the lease is lost they stop, and they start
// again when it is regained (a controller with a fresh queue that starts by queueing every key).
// Only the holder works.
func RunLeased(ctx context.Context, js jetstream.JetStream, name string, opts []lease.Option, runs ...func(ctx context.Context) error) error {
	err := lease.Run(ctx, js, name, lease.DefaultHolder(), lease.DefaultTTL, func(ctx context.Context) error {
		g, ctx := errgroup.WithContext(ctx)
		for _, run := range runs {
			g.Go(func() error { return run(ctx) })
		}
		return g.Wait()
	}, opts...)
	if ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
		return nil
	}
	return err
}
