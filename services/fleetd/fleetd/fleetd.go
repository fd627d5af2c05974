// Package fleetd runs every Fleetstream service in one process around an embedded JetStream
// server: the laptop, demo and test setup.
package fleetd

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/audit"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/console"
	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/natsmetrics"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/services/cluster-agent/hosted"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/mcs"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/xds"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// Config is fleetd's configuration.
type Config struct {
	// DataDir holds JetStream's store; state survives restarts.
	DataDir string
	// Server is the one HTTP listener for every API, health and metrics.
	Server server.Config
	// NATSListen is host:port where agents reach the embedded NATS server.
	NATSListen    string
	ClusterImport clusterimport.Config
	// CredentialsKeyFile holds the keys that seal cluster credentials at rest (pkg/sealed);
	// empty means DefaultCredentialsKeyFile in DataDir, created on first start.
	CredentialsKeyFile string
	// NamespaceBinding configures the project service.
	NamespaceBinding namespacebinding.Config
	// Authz names the platform admins; with --insecure-dev every caller is "anonymous", who is
	// then made a platform admin so the laptop setup can do everything.
	Authz authz.Config
	// RBAC configures rbac-sync.
	RBAC rbacsync.Config
	// Endpoints configures endpoint-collector (multi-cluster endpoints and weights).
	Endpoints collector.Config
	// HostedAgents runs, in this process, the agents of clusters that have stored credentials
	// and no agent of their own (cluster-agent --hosted); fleetd's command turns it on.
	HostedAgents bool
	// Hosted configures them; its NATS URL and token are fleetd's own.
	Hosted hosted.Config
	// XDSListen is host:port of the xDS server (gRPC) serving the endpoints to proxies; empty
	// serves no xDS.
	XDSListen string
	// Retention overrides the limits of streams by name (--stream-retention), for every service
	// at once; by default the domain event streams are kept forever (docs/events.md).
	Retention topology.Retentions
	// KubeBridge publishes the fleet onto a hub Kubernetes API server (ClusterProfiles,
	// PlacementDecisions) when its kubeconfig is given (--kube-bridge-kubeconfig).
	KubeBridge kubebridge.Config
	// NATSAdminTokenFile holds the token of the operator's NATS identity on the embedded server,
	// for `fleetctl admin backup`: natsauth.AdminPermissions, JetStream's API and snapshots of
	// every stream and none of their subjects, as the fleetstream-admin user of a NATS cluster.
	// Empty: no such identity exists.
	NATSAdminTokenFile string
	// NATSServiceTokens admits, on the embedded server, clients presenting one of these tokens
	// (service → token) as that hub service, with its permissions from pkg/natsauth, as the
	// auth callout admits a service on a NATS cluster. fleetd's services share its in-process
	// connection, so nothing needs it to run; it lets an operator's NATS CLI connect as one
	// service, as the alerts' runbooks in docs/operations.md do, and tests prove what those
	// permissions allow. The hosted agents' and kube bridge's services have tokens of fleetd's own.
	NATSServiceTokens map[string]string
	// Console configures the web console's OIDC sign-in (--console-oidc-*).
	Console console.Config
}

// Validate checks the configuration as fleetd's flags give it, naming the flag of a bad value:
// fleetd's own and every service's, as each service's binary checks them.
func (c *Config) Validate() error {
	var dataDir error
	if c.DataDir == "" {
		dataDir = errors.New("--data-dir is required")
	}
	var hostedAgents error
	if c.HostedAgents {
		hostedAgents = c.Hosted.Validate()
	}
	return errors.Join(dataDir,
		c.Server.Validate(),
		flagcheck.HostPort("nats-listen", c.NATSListen, false),
		xds.ValidateListen(c.XDSListen),
		c.ClusterImport.Validate(),
		c.NamespaceBinding.Validate(),
		c.RBAC.Validate(),
		c.Endpoints.Validate(),
		hostedAgents,
		c.KubeBridge.Validate(),
		c.Console.Validate(),
	)
}

// Instance is a running fleetd.
type Instance struct {
	NATS          *natsembed.Server
	Conn          *nats.Conn
	JS            jetstream.JetStream
	ClusterImport *clusterimport.Registry
	// NamespaceBinding is the project service (projects, namespace bindings, quotas).
	NamespaceBinding *namespacebinding.Service
	RBAC             *rbacsync.Service
	Endpoints        *collector.Collector
	// MCS writes the multi-cluster Services' imports for member clusters (issue 33).
	MCS *mcs.Service
	// Audit serves the audit trail and indexes the event streams for it.
	Audit *audit.Service
	// Hosted runs the hosted agents; nil unless Config.HostedAgents.
	Hosted *hosted.Supervisor
	// KubeBridge publishes the fleet to the hub API server; nil unless Config.KubeBridge is
	// enabled.
	KubeBridge *kubebridge.Bridge
	// Addr is where the HTTP listener listens.
	Addr string
	// XDS is the xDS server and XDSAddr where it listens (with Config.XDSListen).
	XDS     *xds.Server
	XDSAddr string
	// Metrics is the registry /metrics serves, with every service's collectors.
	Metrics *server.Registry

	cancel        context.CancelFunc
	lock          *os.File
	group         *errgroup.Group
	ready         <-chan struct{}
	clusterImport atomic.Pointer[clusterimport.Registry]
}

// Start starts the embedded server and every service and returns once the HTTP listener is
// bound; Ready tells when the services have caught up.
func Start(ctx context.Context, cfg Config, log *zap.Logger) (*Instance, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("fleetd: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("fleetd: data dir: %w", err)
	}
	keyring, err := credentialsKeyring(cfg.DataDir, cfg.CredentialsKeyFile, log)
	if err != nil {
		return nil, err
	}
	cfg.ClusterImport.Keyring = keyring
	host, port, err := splitHostPort(cfg.NATSListen)
	if err != nil {
		return nil, fmt.Errorf("fleetd: --nats-listen: %w", err)
	}
	srv, err := server.New(cfg.Server, log)
	if err != nil {
		return nil, err
	}
	console.Mount(srv, consoleOptions(cfg.Console, srv))
	// NATS always authenticates, even with --insecure-dev: agents present the token they got at
	// registration and are confined to their own cluster's subjects; fleetd's own in-process
	// connection uses a token that lives only in this process.
	internal, err := randomToken()
	if err != nil {
		return nil, err
	}
	inst := &Instance{Metrics: srv.Registry()}
	if inst.lock, err = lockDataDir(cfg.DataDir); err != nil {
		return nil, err
	}
	// One permission table (pkg/natsauth) for agents and subscribers, resolved by cluster-import
	// once it runs; the in-process connection is every service at once and keeps full access.
	// The hosted agents run in this process but connect like the hosted-agent service of the
	// compose stack, with a token of their own, so each is confined to its cluster's subjects.
	hostedToken, err := randomToken()
	if err != nil {
		return nil, err
	}
	// The kube bridge runs in this process too, on a connection of its own as the kube-bridge
	// service: it may read the views it publishes and write nothing.
	bridgeToken, err := randomToken()
	if err != nil {
		return nil, err
	}
	byService := map[string]string{natsauth.ServiceHostedAgent: hostedToken, natsauth.ServiceKubeBridge: bridgeToken}
	for svc, token := range cfg.NATSServiceTokens {
		if _, taken := byService[svc]; taken {
			inst.shutdown()
			return nil, fmt.Errorf("fleetd: NATS service tokens: %s runs in fleetd with a token of its own", svc)
		}
		if len(token) < 16 {
			inst.shutdown()
			return nil, fmt.Errorf("fleetd: NATS service tokens: the token of %s is %d characters; use at least 16 random ones", svc, len(token))
		}
		byService[svc] = token
	}
	serviceTokens, err := natsauth.NewServiceTokens(byService)
	if err != nil {
		inst.shutdown()
		return nil, fmt.Errorf("fleetd: %w", err)
	}
	var admin string
	if cfg.NATSAdminTokenFile != "" {
		admin, err = daemon.ReadSecretFile(cfg.NATSAdminTokenFile)
		if err != nil {
			inst.shutdown()
			return nil, fmt.Errorf("fleetd: --nats-admin-token-file: %w", err)
		}
		if len(admin) < 16 {
			inst.shutdown()
			return nil, fmt.Errorf("fleetd: --nats-admin-token-file: the token is %d characters; use at least 16 random ones", len(admin))
		}
	}
	auth := &natsauth.Authenticator{FullAccessTokens: []string{internal}, AdminToken: admin, Log: log.Named("nats-auth"),
		Resolve: func(ctx context.Context, user, token string) (natsauth.Identity, bool) {
			ci := inst.clusterImport.Load()
			if ci == nil {
				return natsauth.Identity{}, false
			}
			return ci.NATSResolver(serviceTokens)(ctx, user, token)
		}}
	ns, err := natsembed.Start(natsembed.Config{
		Name: "fleetd", StoreDir: filepath.Join(cfg.DataDir, "jetstream"), Host: host, Port: port, Logger: log.Named("nats"), Auth: auth,
	})
	if err != nil {
		inst.shutdown()
		return nil, fmt.Errorf("fleetd: %w", err)
	}
	inst.NATS = ns
	// Revoking an agent or subscriber closes its open connections: this is the only server.
	cfg.ClusterImport.Kicker = natsauth.ServerKicker{Server: ns.Server}
	ok := false
	defer func() {
		if !ok {
			inst.shutdown()
		}
	}()
	inst.Conn, err = nats.Connect("", nats.InProcessServer(ns), nats.Name("fleetd"), nats.MaxReconnects(-1), nats.Token(internal))
	if err != nil {
		return nil, fmt.Errorf("fleetd: connect to embedded nats: %w", err)
	}
	if inst.JS, err = jetstream.New(inst.Conn); err != nil {
		return nil, fmt.Errorf("fleetd: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return nil, fmt.Errorf("fleetd: listen %s: %w", cfg.Server.Listen, err)
	}
	inst.Addr = ln.Addr().String()

	ctx, cancel := context.WithCancel(ctx)
	inst.cancel = cancel
	g, ctx := errgroup.WithContext(ctx)
	inst.group = g
	// Construct every service, then start them all: a construction that fails stops what the
	// ones before it started in the background.
	fail := func(err error) (*Instance, error) {
		cancel()
		_ = g.Wait()
		_ = ln.Close()
		return nil, err
	}
	// One authorizer for every API of the process (and the xDS server's), run last (below): it
	// mirrors views the services create. Built first because the collector merges endpoints
	// per owning project from its namespace-bindings mirror.
	azCfg := cfg.Authz
	if cfg.Server.InsecureDev {
		azCfg = azCfg.ForInsecureDev()
	}
	az := authz.New(inst.JS, azCfg, log)
	denials := audit.NewDenialRecorder(inst.JS, audit.DefaultDenialLimits, log)
	srv.Registry().MustRegister(denials.Collectors()...)
	// fleetd's own connections are in-process (they never reconnect); its stores' publish
	// retries and its readers' consumer recreations are counted all the same.
	srv.Registry().MustRegister(natsmetrics.Collectors()...)
	az.RecordDenials(denials)
	g.Go(func() error { return denials.Run(ctx) })
	// Every service is built as its own binary builds it (NewFromEnv), on this process's
	// connection, server, authorizer and group.
	env := &daemon.Env{Options: &daemon.Options{Server: cfg.Server, Retention: cfg.Retention},
		Log: log, Conn: inst.Conn, JS: inst.JS, Server: srv, Authz: az, Group: g}
	if inst.ClusterImport, err = clusterimport.NewFromEnv(ctx, env, cfg.ClusterImport); err != nil {
		return fail(err)
	}
	inst.clusterImport.Store(inst.ClusterImport)
	if inst.NamespaceBinding, err = namespacebinding.NewFromEnv(ctx, env, cfg.NamespaceBinding); err != nil {
		return fail(err)
	}
	if inst.RBAC, err = rbacsync.NewFromEnv(ctx, env, cfg.RBAC); err != nil {
		return fail(err)
	}
	if inst.Endpoints, err = collector.NewFromEnv(ctx, env, cfg.Endpoints); err != nil {
		return fail(err)
	}
	inst.MCS = mcs.NewFromEnv(env, inst.Endpoints, cfg.Endpoints.NoViewWrites)
	if inst.XDS, inst.XDSAddr, err = xds.Listen(ctx, env, inst.Endpoints, cfg.XDSListen); err != nil {
		return fail(fmt.Errorf("fleetd: %w", err))
	}
	// The audit trail: rbac-sync's binary serves it in a distributed hub (docs/architecture.md).
	if inst.Audit, err = audit.New(ctx, inst.JS, audit.Config{Retention: cfg.Retention}, log); err != nil {
		return fail(err)
	}
	components := []server.Component{inst.ClusterImport, inst.NamespaceBinding, inst.RBAC, inst.Endpoints, inst.MCS, inst.Audit}
	if inst.XDS != nil {
		components = append(components, inst.XDS)
	}
	readies := server.Start(ctx, g, srv, components...)
	if cfg.HostedAgents {
		// The settings fleetd's hosted agents share with its services (one flag each): one
		// policy for what a kubeconfig may hold, the one cluster-import checked it with; and
		// the agents refuse the namespaces the API refuses.
		cfg.Hosted.Credentials = cfg.ClusterImport.Credentials
		cfg.Hosted.Member.Protected = cfg.NamespaceBinding.Protected
		if inst.Hosted, err = startHosted(ctx, g, ns, cfg.Hosted, hostedToken, log); err != nil {
			return fail(err)
		}
		if err := inst.Hosted.Register(srv.Registry()); err != nil {
			return fail(err)
		}
	}
	if cfg.KubeBridge.Enabled() {
		if cfg.KubeBridge.APIURL == "" {
			// The bridge writes into Fleetstream through the API as any client does, with
			// its own (limited) identity: here, fleetd's own listener.
			cfg.KubeBridge.APIURL = "http://" + inst.Addr
		}
		if inst.KubeBridge, err = startKubeBridge(ctx, g, ns, srv, cfg.KubeBridge, bridgeToken, log); err != nil {
			return fail(err)
		}
	}
	srv.Authorize(az.Interceptor())
	srv.ReadyWhen("authz", az.Ready())
	g.Go(func() error { return az.Run(ctx) })
	readies = append(readies, az.Ready())
	inst.ready = allClosed(readies...)
	g.Go(func() error { return srv.ServeListener(ctx, ln) })
	ok = true
	return inst, nil
}

// startHosted runs the hosted agents' supervisor on a connection of its own, as the hosted-agent
// service; each hosted agent connects to the embedded server in process.
func startHosted(ctx context.Context, g *errgroup.Group, ns *natsembed.Server, cfg hosted.Config, token string, log *zap.Logger) (*hosted.Supervisor, error) {
	inProcess := nats.InProcessServer(ns)
	nc, err := nats.Connect("", inProcess, nats.Name("fleetd-hosted-agents"), nats.MaxReconnects(-1), nats.Token(token),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.ServiceHostedAgent)))
	if err != nil {
		return nil, fmt.Errorf("fleetd: hosted agents: connect to embedded nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("fleetd: hosted agents: %w", err)
	}
	cfg.NATSURL, cfg.ServiceToken = ns.ClientURL(), token
	cfg.NATSOptions = append(cfg.NATSOptions, inProcess)
	sup, err := hosted.New(cfg, js, log)
	if err != nil {
		nc.Close()
		return nil, err
	}
	g.Go(func() error {
		defer nc.Close()
		return sup.Run(ctx)
	})
	return sup, nil
}

// startKubeBridge runs the kube bridge on a connection of its own, as the kube-bridge service
// (natsauth: read-only). Its readiness is not fleetd's: a hub API server that cannot be reached
// must not take the fleet's API out of service; Instance.KubeBridge.Ready tells.
func startKubeBridge(ctx context.Context, g *errgroup.Group, ns *natsembed.Server, srv *server.Server, cfg kubebridge.Config, token string, log *zap.Logger) (*kubebridge.Bridge, error) {
	nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name("fleetd-kube-bridge"), nats.MaxReconnects(-1), nats.Token(token),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.ServiceKubeBridge)))
	if err != nil {
		return nil, fmt.Errorf("fleetd: kube bridge: connect to embedded nats: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("fleetd: kube bridge: %w", err)
	}
	b, err := kubebridge.NewFromKubeconfig(cfg, js, log)
	if err != nil {
		nc.Close()
		return nil, err
	}
	srv.Registry().MustRegister(b.Collectors()...)
	g.Go(func() error {
		defer nc.Close()
		return b.Run(ctx)
	})
	return b, nil
}

// Ready is closed when every service answers from current state.
func (i *Instance) Ready() <-chan struct{} { return i.ready }

// allClosed returns a channel closed once every one of chs is.
func allClosed(chs ...<-chan struct{}) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		for _, ch := range chs {
			<-ch
		}
		close(out)
	}()
	return out
}

// Wait blocks until the instance stops and returns the first error that stopped it.
func (i *Instance) Wait() error {
	err := i.group.Wait()
	i.shutdown()
	return err
}

// Stop stops every service and the embedded server.
func (i *Instance) Stop() {
	i.cancel()
	_ = i.group.Wait()
	i.shutdown()
}

func (i *Instance) shutdown() {
	if i.Conn != nil {
		i.Conn.Close()
	}
	if i.NATS != nil && i.NATS.Running() {
		i.NATS.Stop()
	}
	if i.lock != nil {
		_ = i.lock.Close() // after the server stopped: releases the data dir
	}
}

func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("fleetd: internal token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func splitHostPort(hp string) (string, int, error) {
	if hp == "" {
		return "127.0.0.1", -1, nil
	}
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	if port == 0 {
		port = -1
	}
	return h, port, nil
}

// consoleOptions are the console's: its flags, and the issuer of --oidc-issuer-url, if any, to
// sign in with.
func consoleOptions(c console.Config, srv *server.Server) console.Options {
	return console.Options{Config: c, OIDC: srv.Authenticator().OIDCEndpoints}
}
