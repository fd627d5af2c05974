// Package agent is the per-member-cluster agent: it reports heartbeats (with the resources of
// the cluster's Ready nodes) and the namespace inventory of its cluster into JetStream, and
// hosts further reconcilers (appliers, reporters) that share one set of informers.
package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetstream/fleetstream/pkg/events"
	"github.com/fleetstream/fleetstream/pkg/liveness"
)

// Defaults for zero Config fields.
const (
	DefaultHeartbeatInterval = liveness.HeartbeatInterval
	DefaultInventoryResync   = 5 * time.Minute
	DefaultInventoryDebounce = 500 * time.Millisecond
	DefaultResourcesDebounce = time.Second
	// publishTimeout bounds one append, so a stuck NATS connection delays a report rather than
	// blocking its loop forever.
	publishTimeout = 10 * time.Second
)

// Config configures an Agent.
type Config struct {
	// ClusterName is the member cluster's name in the registry; it scopes every subject.
	ClusterName string
	// HeartbeatInterval is how often a heartbeat is published (default liveness.HeartbeatInterval, 10s).
	HeartbeatInterval time.Duration
	// InventoryResync republishes the namespace inventory even without changes (default 5m), so
	// a reader that lost it catches up.
	InventoryResync time.Duration
	// InventoryDebounce is how long a change waits for more before the inventory is published
	// (default 500ms): a burst of namespace events becomes one report.
	InventoryDebounce time.Duration
	// InventoryChunkBytes is the most bytes one namespace inventory message may encode to
	// (default a quarter of the NATS connection's max payload, leaving room for the event
	// envelope and the hub's view entry); a larger inventory is split into chunks
	// (pkg/nsinventory).
	InventoryChunkBytes int
	// ResourcesDebounce is how long a node change waits for more before the Ready nodes are
	// summed again (default 1s); a changed sum is sent with a heartbeat at once.
	ResourcesDebounce time.Duration
	// AgentVersion is reported in heartbeats.
	AgentVersion string
	// Hosted marks an agent the hub runs for the cluster (cluster-agent --hosted). Its
	// heartbeats say so, and it sends them only while the cluster's apiserver answers: the
	// process is always alive, so only the apiserver's answer says the cluster is reachable.
	Hosted bool
}

func (c *Config) defaults() error {
	if c.ClusterName == "" {
		return errors.New("cluster name is required")
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.InventoryResync <= 0 {
		c.InventoryResync = DefaultInventoryResync
	}
	if c.InventoryDebounce <= 0 {
		c.InventoryDebounce = DefaultInventoryDebounce
	}
	if c.ResourcesDebounce <= 0 {
		c.ResourcesDebounce = DefaultResourcesDebounce
	}
	if c.AgentVersion == "" {
		c.AgentVersion = "dev"
	}
	return nil
}

// Runnable is a reconciler or reporter the agent runs after the shared informers have synced.
// Run blocks until ctx ends; an error stops the whole agent, so a Runnable retries transient
// failures itself and returns only what it cannot recover from.
type Runnable interface {
	Run(ctx context.Context) error
}

// RunnableFunc adapts a function to Runnable.
type RunnableFunc func(ctx context.Context) error

// Run calls f.
func (f RunnableFunc) Run(ctx context.Context) error { return f(ctx) }

// Agent runs the reporters and reconcilers of one member cluster.
type Agent struct {
	cfg       Config
	js        jetstream.JetStream
	kube      kubernetes.Interface
	log       *zap.Logger
	store     *events.Store
	factory   informers.SharedInformerFactory
	sessionID string
	heartbeat Runnable
	resources *nodeResources
	runnables []Runnable
	started   bool
}

// New returns an agent for cfg.ClusterName that reports through js about the cluster kube
// connects to. Reconcilers are added with Add before Run.
func New(cfg Config, js jetstream.JetStream, kube kubernetes.Interface, log *zap.Logger) (*Agent, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	if js == nil || kube == nil {
		return nil, errors.New("agent: jetstream and kubernetes clients are required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	log = log.With(zap.String("cluster", cfg.ClusterName))
	a := &Agent{
		cfg:  cfg,
		js:   js,
		kube: kube,
		log:  log,
		// The actor names the cluster, so an event says which agent wrote it.
		store: events.NewStore(js, "system:cluster-agent:"+cfg.ClusterName),
		// No informer-level resync: every handler reacts to real changes, and periodic work
		// (the inventory resync) has its own timer.
		factory:   informers.NewSharedInformerFactory(kube, 0),
		sessionID: uuid.NewString(),
	}
	a.resources = newNodeResources(a)
	a.heartbeat = &heartbeater{agent: a, resources: a.resources}
	a.Add(newInventoryReporter(a))
	return a, nil
}

// Informers returns the factory every reconciler registers its informers with, so each kind is
// watched once however many reconcilers read it. Register before Run.
func (a *Agent) Informers() informers.SharedInformerFactory { return a.factory }

// Kube returns the member cluster's client.
func (a *Agent) Kube() kubernetes.Interface { return a.kube }

// JetStream returns the hub connection.
func (a *Agent) JetStream() jetstream.JetStream { return a.js }

// Store returns the event store reports are appended with, attributed to this agent.
func (a *Agent) Store() *events.Store { return a.store }

// Logger returns the agent's logger.
func (a *Agent) Logger() *zap.Logger { return a.log }

// Config returns the agent's configuration with defaults applied.
func (a *Agent) Config() Config { return a.cfg }

// SessionID identifies this agent instance; it changes when the process restarts.
func (a *Agent) SessionID() string { return a.sessionID }

// Add registers r to run with the agent. It must be called before Run.
func (a *Agent) Add(r Runnable) {
	if a.started {
		panic("agent: Add after Run")
	}
	a.runnables = append(a.runnables, r)
}

// Run starts the informers, heartbeats at once, and runs every Runnable once the informer caches
// have synced, until ctx ends or one fails. It returns nil on a clean shutdown.
//
// Heartbeats do not wait for the caches: an informer that cannot sync (the agent's Kubernetes
// identity may not list some kind) must not make the cluster look dead to the hub.
func (a *Agent) Run(ctx context.Context) error {
	if a.started {
		return errors.New("agent: Run called twice")
	}
	a.started = true
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Shutdown waits for informer goroutines, so none outlives Run.
	defer a.factory.Shutdown()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.heartbeat.Run(gctx) })
	// Like heartbeats, the node sums do not wait for the shared informers, nor the
	// reconcilers for the Node informer.
	g.Go(func() error { return a.resources.Run(gctx) })
	a.factory.Start(gctx.Done())
	g.Go(func() error {
		synced := make(chan struct{})
		go func() {
			defer close(synced)
			a.factory.WaitForCacheSync(gctx.Done())
		}()
		for waiting := true; waiting; {
			select {
			case <-synced:
				waiting = false
			case <-time.After(30 * time.Second):
				a.log.Warn("informer caches not synced yet: may the agent's Kubernetes identity list and watch what it reconciles?")
			}
		}
		if gctx.Err() != nil {
			return nil
		}
		a.log.Info("cluster agent running", zap.String("session", a.sessionID))
		for _, r := range a.runnables {
			g.Go(func() error { return r.Run(gctx) })
		}
		return nil
	})
	if err := g.Wait(); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// appendReport publishes msg as a report about this cluster, bounded by publishTimeout.
func (a *Agent) appendReport(ctx context.Context, subject string, msg proto.Message) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	// No events.Command: a report is a snapshot of this cluster's facts, the latest wins (FLEET_AGENT keeps one per subject).
	_, err := a.store.Append(ctx, subject, a.cfg.ClusterName, events.Any, msg)
	return err
}
