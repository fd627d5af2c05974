// Package hosted runs, in one hub process (cluster-agent --hosted, or inside fleetd), the agents
// of member clusters that have stored connection credentials and no agent of their own: the
// clusters an import policy brought in, or that an admin registered with credentials.
//
// The supervisor's own NATS identity (the hosted-agent service) can only read the cluster
// registry and the agents' statuses and ask cluster-import for a cluster's credentials. Each
// hosted agent connects separately as that cluster's agent (natsauth.HostedAgentUser), so it is
// confined to the cluster's subjects exactly like an in-cluster agent, and runs the same code
// (package member) with its own client-go.
//
// A cluster is hosted while its credentials are set and no in-cluster agent has sent a heartbeat
// within InClusterGrace; it is dropped when it is deregistered, loses its credentials or its own
// agent appears, and restarted when its credentials change (rotation reconnects). One replica
// supervises at a time (a lease), so no cluster is hosted twice.
package hosted

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/rest"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/kubecreds"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/liveness"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/cluster-agent/member"
)

// Lease is the lease the supervising replica holds.
const Lease = "cluster-agent.hosted"

// Defaults for zero Config fields.
const (
	// DefaultInClusterGrace matches cluster-import's default UnreachableAfter: an in-cluster
	// agent silent for that long has lost the cluster to the hosted agents.
	DefaultInClusterGrace = liveness.UnreachableAfter
	DefaultRetry          = 5 * time.Second
	requestTimeout        = 10 * time.Second
)

// Config configures a Supervisor.
type Config struct {
	// NATSURL is where hosted agents connect (comma separated URLs).
	NATSURL string
	// ServiceToken is the hosted-agent service's NATS token; hosted agents present it with
	// their cluster's user name.
	ServiceToken string
	// Member is the template of every hosted agent's configuration (intervals, EndpointSlice
	// filter, version); the cluster's name and id are filled in and Hosted is set.
	Member member.Config
	// InClusterGrace: a cluster whose own agent sent a heartbeat within it is left to that agent.
	InClusterGrace time.Duration
	// Retry is how long a hosted agent that failed to start or stopped with an error waits
	// before it is started again (default 5s).
	Retry time.Duration
	// NATSOptions are added to every hosted agent's connection (TLS, for example).
	NATSOptions []nats.Option
	// Credentials says what a cluster's kubeconfig may hold beyond inline data
	// (--credentials-allowed-proxies). Stored credentials are checked again here, whatever
	// cluster-import checked when they were written: older values were never checked.
	Credentials kubecreds.Policy
}

// Supervisor starts and stops the hosted agents.
type Supervisor struct {
	cfg Config
	// js is the supervisor's own connection (the hosted-agent service).
	js  jetstream.JetStream
	log *zap.Logger
	now func() time.Time
	// leases reports the supervision lease (fleetstream_lease_leading).
	leases *lease.Metrics

	mu      sync.Mutex
	running map[string]*hostedAgent
	// refused holds, by cluster, why its stored credentials were refused: such a cluster's
	// agent waits for new credentials instead of retrying. Its own lock: reconcile holds mu
	// while it waits for an agent to stop, and the agent may be recording its refusal.
	refusedMu sync.Mutex
	refused   map[string]string
}

// hostedAgent is one running hosted agent.
type hostedAgent struct {
	cluster     string
	fingerprint string
	cancel      context.CancelFunc
	done        chan struct{}
}

// New returns a supervisor reading the registry through js.
func New(cfg Config, js jetstream.JetStream, log *zap.Logger) (*Supervisor, error) {
	if cfg.NATSURL == "" || cfg.ServiceToken == "" {
		return nil, errors.New("hosted agents: a NATS URL and the hosted-agent service token are required")
	}
	if cfg.InClusterGrace <= 0 {
		cfg.InClusterGrace = DefaultInClusterGrace
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	if log == nil {
		log = zap.NewNop()
	}
	cfg.Member.Hosted = true
	return &Supervisor{cfg: cfg, js: js, log: log.Named("hosted"), now: time.Now, leases: lease.NewMetrics(), running: map[string]*hostedAgent{}, refused: map[string]string{}}, nil
}

// Run supervises while this replica holds the lease, until ctx ends.
func (s *Supervisor) Run(ctx context.Context) error {
	// A registry cache failing while this replica holds the lease (a request timing out under a
	// reconnecting fleet) restarts the supervision after a pause; returned to the lease runner it
	// would end the service, and fleetd with it.
	supervise := func(ctx context.Context) error {
		return events.Retry(ctx, s.log, "hosted agents' supervision failed", func() error { return s.supervise(ctx) }, errRegistry)
	}
	err := lease.Run(ctx, s.js, Lease, lease.DefaultHolder(), lease.DefaultTTL, supervise, lease.WithLogger(s.log), lease.WithMetrics(s.leases))
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Register registers the supervisor's lease gauge (fleetstream_lease_leading) on reg: fleetd's
// server; the cluster-agent binary serves no metrics.
func (s *Supervisor) Register(reg prometheus.Registerer) error { return s.leases.Register(reg) }

// errRegistry: a cache of the registry the supervisor reads failed.
var errRegistry = errors.New("registry cache failed")

// Hosting returns the clusters whose hosted agents run now, sorted.
func (s *Supervisor) Hosting() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.running))
}

func (s *Supervisor) supervise(ctx context.Context) error {
	// Every hosted agent stops with the lease: another replica may start it at once.
	defer s.stopAll()
	clustersKV, err := view.WaitBucket(ctx, s.js, subjects.ClustersBucket, s.log)
	if err != nil {
		return nilIfDone(ctx, err)
	}
	statusKV, err := view.WaitBucket(ctx, s.js, subjects.ClusterStatusBucket, s.log)
	if err != nil {
		return nilIfDone(ctx, err)
	}
	r := &registry{
		clusters: view.NewCache(s.js, clustersKV, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, s.log),
		status:   view.NewCache(s.js, statusKV, func() *clusterv1.AgentStatus { return &clusterv1.AgentStatus{} }, s.log),
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- r.clusters.Run(ctx) }()
	go func() { errs <- r.status.Run(ctx) }()
	for _, ready := range []<-chan struct{}{r.clusters.Ready(), r.status.Ready()} {
		select {
		case <-ready:
		case err := <-errs:
			return fmt.Errorf("hosted agents: %w: %w", errRegistry, err)
		case <-ctx.Done():
			return nil
		}
	}

	// Each change queues its own cluster, and the worker looks at that cluster alone: a
	// heartbeat costs the supervisor the work of one cluster, not a pass over the fleet (at
	// 2,000 clusters that pass, on every heartbeat, took 70% of fleetd's CPU; issue 26).
	q := newQueue()
	worker := make(chan struct{})
	go func() {
		defer close(worker)
		for s.processNext(ctx, q, r) {
		}
	}()
	// Before stopAll: no reconcile may start an agent after it.
	defer func() {
		q.ShutDown()
		<-worker
	}()
	return s.follow(ctx, r, q, errs, updatesBuffer)
}

// follow queues the cluster of every change of r, and every cluster at the start and each
// resyncEvery, until ctx ends or a cache fails (on errs). buf is how many changes it may fall
// behind a cache before the cache cuts it off.
func (s *Supervisor) follow(ctx context.Context, r *registry, q queue, errs <-chan error, buf int) error {
	clusterUpdates := r.clusters.Updates(ctx, buf)
	statusUpdates := r.status.Updates(ctx, buf)
	s.resync(q, r)
	tick := time.NewTicker(resyncEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("hosted agents: %w: %w", errRegistry, err)
		case u, ok := <-clusterUpdates:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				// Cut off for falling behind: whatever was missed is in the cache now. (A closed
				// channel left in the select would be ready forever: a busy loop.)
				clusterUpdates = r.clusters.Updates(ctx, buf)
				s.resync(q, r)
				continue
			}
			s.enqueue(q, u.Key)
		case u, ok := <-statusUpdates:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				statusUpdates = r.status.Updates(ctx, buf)
				s.resync(q, r)
				continue
			}
			s.enqueue(q, u.Key)
		case <-tick.C:
			s.resync(q, r)
		}
	}
}

// Refused returns, by cluster, why the stored credentials of a hosted cluster were refused
// (the fields named, never a value). The cluster is not connected until its credentials are
// replaced.
func (s *Supervisor) Refused() map[string]string {
	s.refusedMu.Lock()
	defer s.refusedMu.Unlock()
	return maps.Clone(s.refused)
}

// decide says whether cluster name should have a hosted agent now: it has credentials and no
// agent of its own heartbeating within InClusterGrace. When its own agent runs, recheck is how
// long until that grace runs out without another heartbeat.
func (s *Supervisor) decide(name string, r *registry) (c *clusterv1.Cluster, host bool, recheck time.Duration) {
	key := keys.Encode(name)
	c, ok := r.clusters.Get(key)
	if !ok || !c.GetStatus().GetCredentialsSet() {
		return nil, false, 0
	}
	if st, ok := r.status.Get(key); ok && st.InClusterLastSeen != nil {
		if left := s.cfg.InClusterGrace - s.now().Sub(st.InClusterLastSeen.AsTime()); left > 0 {
			return c, false, left // its own agent runs
		}
	}
	return c, true, 0
}

// reconcile starts the hosted agent of cluster name if it should run and stops it if it
// should not, or restarts it when its credentials changed. It returns decide's recheck.
func (s *Supervisor) reconcile(ctx context.Context, name string, r *registry) time.Duration {
	c, host, recheck := s.decide(name, r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.running[name]; ok {
		if host && c.Status.CredentialsFingerprint == h.fingerprint {
			return recheck
		}
		h.stop()
		delete(s.running, name)
		s.setRefused(name, "")
		if host {
			s.log.Info("credentials changed: reconnecting hosted agent", zap.String("cluster", name))
		} else {
			s.log.Info("hosted agent stopped", zap.String("cluster", name))
		}
	}
	if !host {
		return recheck
	}
	hctx, cancel := context.WithCancel(ctx)
	h := &hostedAgent{cluster: name, fingerprint: c.Status.CredentialsFingerprint, cancel: cancel, done: make(chan struct{})}
	s.running[name] = h
	go func() {
		defer close(h.done)
		s.keepRunning(hctx, c.Name, c.Id)
	}()
	s.log.Info("hosted agent started", zap.String("cluster", name))
	return recheck
}

// setRefused records why cluster's credentials were refused; "" forgets it.
func (s *Supervisor) setRefused(cluster, why string) {
	s.refusedMu.Lock()
	defer s.refusedMu.Unlock()
	if why == "" {
		delete(s.refused, cluster)
		return
	}
	s.refused[cluster] = why
}

func (h *hostedAgent) stop() {
	h.cancel()
	<-h.done
}

func (s *Supervisor) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, h := range s.running {
		h.stop()
		delete(s.running, name)
		s.setRefused(name, "")
	}
}

// keepRunning runs the hosted agent of cluster until ctx ends, starting it again after Retry
// whenever it fails.
func (s *Supervisor) keepRunning(ctx context.Context, cluster, id string) {
	log := s.log.With(zap.String("cluster", cluster))
	for {
		err := s.runOnce(ctx, cluster, id, log)
		if ctx.Err() != nil {
			return
		}
		if kubecreds.IsRefused(err) {
			// The same credentials are refused every time: wait for new ones (a credentials
			// change restarts this agent).
			log.Error("hosted agent not started: the cluster's stored credentials are refused; replace them (UpdateCluster)", zap.Error(err))
			s.setRefused(cluster, err.Error())
			<-ctx.Done()
			return
		}
		log.Warn("hosted agent stopped; starting it again", zap.Duration("after", s.cfg.Retry), zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.Retry):
		}
	}
}

func (s *Supervisor) runOnce(ctx context.Context, cluster, id string, log *zap.Logger) error {
	creds, err := s.credentials(ctx, cluster)
	if err != nil {
		return err
	}
	// Before anything connects: a refused kubeconfig must not reach NATS or the cluster.
	kubeCfg, err := RESTConfig(creds, s.cfg.Credentials)
	if err != nil {
		return fmt.Errorf("credentials of cluster %s: %w", cluster, err)
	}
	opts := append([]nats.Option{
		nats.Name("cluster-agent-hosted/" + cluster),
		nats.UserInfo(natsauth.HostedAgentUser(cluster), s.cfg.ServiceToken),
		nats.CustomInboxPrefix(natsauth.AgentInboxPrefix(cluster)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		// Refused while the hub's authentication catches up after a restart: keep trying
		// rather than close at the second refusal (cmd/cluster-agent, connectNATS).
		nats.IgnoreAuthErrorAbort(),
	}, s.cfg.NATSOptions...)
	nc, err := nats.Connect(s.cfg.NATSURL, opts...)
	if err != nil {
		return fmt.Errorf("connect to nats as the agent of cluster %s: %w", cluster, err)
	}
	defer nc.Close()
	log.Info("hosted agent connected to NATS as the cluster's agent")
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	cfg := s.cfg.Member
	cfg.ClusterName, cfg.ClusterID = cluster, id
	a, err := member.New(cfg, js, kubeCfg, s.log) // the agent names its cluster itself
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// credentials asks cluster-import for the cluster's connection credentials.
func (s *Supervisor) credentials(ctx context.Context, cluster string) (*clusterv1.ConnectionCredentials, error) {
	req, err := proto.Marshal(&clusterv1.HostedAgentCredentialsRequest{ClusterName: cluster})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	m, err := s.js.Conn().RequestWithContext(rctx, subjects.HostedCredentials(cluster), req)
	if err != nil {
		return nil, fmt.Errorf("request credentials of cluster %s: %w", cluster, err)
	}
	resp := &clusterv1.HostedAgentCredentialsResponse{}
	if err := proto.Unmarshal(m.Data, resp); err != nil {
		return nil, fmt.Errorf("credentials of cluster %s: %w", cluster, err)
	}
	if resp.Error != "" {
		return nil, errors.New(resp.Error)
	}
	return resp.Credentials, nil
}

// RESTConfig is the client configuration stored credentials describe: their kubeconfig (its
// current context), or the server with its CA and a bearer token or client certificate. Only
// inline data is used (pkg/kubecreds): a kubeconfig with an exec plugin, a file path or an
// unlisted proxy is refused (a *kubecreds.Error) and nothing of it runs.
func RESTConfig(c *clusterv1.ConnectionCredentials, p kubecreds.Policy) (*rest.Config, error) {
	cr, err := kubecreds.Load(c, p)
	if err != nil {
		return nil, err
	}
	return cr.RESTConfig(), nil
}

// nilIfDone drops err when ctx ended: the lease was lost or the process stops.
func nilIfDone(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
