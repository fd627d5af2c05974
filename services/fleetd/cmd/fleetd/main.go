// Command fleetd runs all of Fleetstream in one process with an embedded NATS JetStream server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck"
	"github.com/fleetstream/fleetstream/pkg/logging"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/version"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/xds"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

func main() { os.Exit(run(os.Args[1:])) }

// servePprof serves net/http/pprof on its own listener, never on the API's: profiles expose the
// process's memory, so they are opt-in and apart from what tokens guard.
func servePprof(ctx context.Context, addr string, log *zap.Logger) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--pprof-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	log.Info("serving pprof", zap.String("addr", l.Addr().String()))
	return nil
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "rotate-credentials-key" {
		return rotate(args[1:])
	}
	if len(args) > 0 && args[0] == "restore" {
		return restore(args[1:])
	}
	var cfg fleetd.Config
	var logLevel string
	fs := newFlagSet(&cfg, &logLevel)
	pprofListen := fs.String("pprof-listen", "", "host:port serving Go's /debug/pprof/ (CPU, heap and goroutine profiles, e.g. for make scale); empty serves none. It has no authentication: keep it on loopback")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := errors.Join(cfg.Validate(), flagcheck.HostPort("pprof-listen", *pprofListen, false)); err != nil {
		fmt.Fprintln(os.Stderr, "fleetd:", err)
		return 2
	}
	cfg.Hosted.Member.Version = version.Version
	log, err := logging.New(logLevel, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetd:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *pprofListen != "" {
		if err := servePprof(ctx, *pprofListen, log); err != nil {
			log.Error("fleetd failed to start", zap.Error(err))
			return 1
		}
	}
	inst, err := fleetd.Start(ctx, cfg, log)
	if err != nil {
		log.Error("fleetd failed to start", zap.Error(err))
		return 1
	}
	go func() {
		select {
		case <-inst.Ready():
			log.Info("fleetd ready", zap.String("version", version.Version), zap.String("api", "http://"+inst.Addr), zap.String("nats", inst.NATS.ClientURL()), zap.String("xds", inst.XDSAddr),
				zap.String("try", "fleetctl --server http://"+inst.Addr+" cluster list"))
		case <-ctx.Done():
		}
	}()
	if err := inst.Wait(); err != nil && ctx.Err() == nil {
		log.Error("fleetd stopped", zap.Error(err))
		return 1
	}
	return 0
}

// newFlagSet registers fleetd's flags into cfg and logLevel: its own (data dir, embedded NATS,
// key file, hosted agents) and every service's, by the function the service's binary
// registers them with (the xDS listener's too, with a default that serves it).
func newFlagSet(cfg *fleetd.Config, logLevel *string) *flag.FlagSet {
	fs := flag.NewFlagSet("fleetd", flag.ContinueOnError)
	registerFlags(fs, cfg, logLevel)
	return fs
}

func registerFlags(fs *flag.FlagSet, cfg *fleetd.Config, logLevel *string) {
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for JetStream's store (required; state survives restarts)")
	// Not from the environment, unlike a service's: fleetctl reads FLEETSTREAM_TOKEN_FILE as
	// its own token, which must not become the server's list.
	cfg.Server.RegisterFlags(fs, server.Config{Listen: "127.0.0.1:8080"})
	fs.StringVar(&cfg.NATSListen, "nats-listen", "127.0.0.1:4222", "host:port where cluster agents reach the embedded NATS server")
	fs.StringVar(&cfg.CredentialsKeyFile, "credentials-key-file", "", credentialsKeyFileUsage)
	fs.StringVar(&cfg.NATSAdminTokenFile, "nats-admin-token-file", "", "file holding a token (16 characters or more) of the operator's identity on the embedded NATS server for `fleetctl admin backup`: JetStream's API and snapshots of every stream, none of their subjects (replies on inbox prefix _INBOX_svc_fleetstream-admin); empty: none")
	fs.BoolVar(&cfg.HostedAgents, "hosted-agents", true, "run the agents of clusters that have stored credentials and no agent of their own (imported clusters) in this process")
	xds.RegisterListenFlag(fs, &cfg.XDSListen, "127.0.0.1:18000")
	cfg.Authz.RegisterFlags(fs)
	// Each service's flags as its own binary registers them: same names, same defaults.
	cfg.ClusterImport.RegisterFlags(fs)
	cfg.Endpoints.RegisterFlags(fs)
	cfg.Retention = topology.Retentions{}
	fs.Var(cfg.Retention, "stream-retention", daemon.RetentionUsage)
	cfg.RBAC.RegisterFlags(fs)
	cfg.NamespaceBinding.RegisterFlags(fs)
	// The hosted agents' flags (cluster-agent --hosted's). Two are cluster-import's and
	// namespace-binding's too, with the same meaning, so fleetd has one flag for both: what the
	// registry lets a stored kubeconfig hold is what the hosted agents accept, and the namespaces
	// the API refuses are those the agents never write (Start copies them over).
	addFlags(fs, cfg.Hosted.RegisterFlags, "credentials-allowed-proxies", "protected-namespaces")
	cfg.KubeBridge.RegisterFlags(fs)
	cfg.Console.RegisterFlags(fs)
	fs.StringVar(logLevel, "log-level", "info", "debug, info, warn or error")
}

// addFlags registers a service's flags into fs. A name fs already has is taken as the same
// setting, registered once, only if shared lists it; any other clash panics (flag redefined):
// two services' flags of one name and different meanings need the newer one's service name as
// a prefix (docs/architecture.md, "a new flag of a service").
func addFlags(fs *flag.FlagSet, register func(*flag.FlagSet), shared ...string) {
	own := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	register(own)
	own.VisitAll(func(f *flag.Flag) {
		if fs.Lookup(f.Name) != nil && slices.Contains(shared, f.Name) {
			return
		}
		fs.Var(f.Value, f.Name, f.Usage)
	})
}
