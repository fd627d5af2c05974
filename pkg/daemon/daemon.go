// Package daemon is the common main of every Fleetstream service binary: flags, logging,
// signals, the NATS connection and the HTTP server, so each service's main only wires itself.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/audit"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/flagcheck"
	"github.com/fleetstream/fleetstream/pkg/logging"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/natsmetrics"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/version"
)

// Options are the flags every service shares.
type Options struct {
	NATSURL       string
	NATSTokenFile string
	Server        server.Config
	Authz         authz.Config
	Replicas      int
	// Retention overrides the limits of the streams this service ensures (--stream-retention).
	Retention  topology.Retentions
	LogLevel   string
	LogConsole bool

	// NATSUser, when set, connects as this NATS user with NATSTokenFile as its password: the
	// auth callout's responder (cluster-import), which bypasses the callout it answers.
	NATSUser string
}

// Register adds the shared flags to fs.
func (o *Options) Register(fs *flag.FlagSet) {
	fs.StringVar(&o.NATSURL, "nats-url", envOr("FLEETSTREAM_NATS_URL", nats.DefaultURL), "NATS server URLs, comma-separated")
	fs.StringVar(&o.NATSTokenFile, "nats-token-file", os.Getenv("FLEETSTREAM_NATS_TOKEN_FILE"), "file holding the NATS token (with --nats-user: the user's password)")
	fs.StringVar(&o.NATSUser, "nats-user", os.Getenv("FLEETSTREAM_NATS_USER"), "NATS user to connect as (the auth callout responder's static user); empty connects with the token")
	o.Server.RegisterFlags(fs, server.EnvDefaults())
	o.Authz.RegisterFlags(fs)
	fs.IntVar(&o.Replicas, "replicas", 1, "replicas of the streams and buckets this service owns (3 on a production cluster)")
	o.Retention = topology.Retentions{}
	fs.Var(o.Retention, "stream-retention", RetentionUsage)
	fs.StringVar(&o.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.LogConsole, "log-console", false, "human-readable logs instead of JSON")
}

// Validate checks the shared flags' values, naming the flag of a bad one.
func (o *Options) Validate() error {
	if err := flagcheck.NATSURLs("nats-url", o.NATSURL); err != nil {
		return err
	}
	if err := o.Server.Validate(); err != nil {
		return err
	}
	// JetStream keeps at most 5 replicas of a stream; 0 is the services' default, 1.
	if o.Replicas < 0 || o.Replicas > 5 {
		return fmt.Errorf("--replicas %d: want 1 to 5", o.Replicas)
	}
	return nil
}

// RetentionUsage documents --stream-retention (fleetd has the same flag).
const RetentionUsage = "override a stream's retention, `STREAM=max-age=DURATION,max-bytes=SIZE` (repeat per stream; " +
	"default: domain event streams are kept forever, FLEET_DLQ 30 days; give every service that ensures the stream the same value; see docs/events.md)"

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// ReadSecretFile returns the first line of a secret file, trimmed.
func ReadSecretFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read secret file: %w", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	line = strings.TrimSpace(line)
	if line == "" {
		return "", fmt.Errorf("secret file %s is empty", path)
	}
	return line, nil
}

// Connect connects to NATS, retrying until it succeeds or ctx ends: in a compose stack the
// servers may start after the service.
func Connect(ctx context.Context, url, tokenFile, name string, log *zap.Logger) (*nats.Conn, jetstream.JetStream, error) {
	return ConnectAs(ctx, url, "", tokenFile, name, log)
}

// ConnectAs is Connect as NATS user user (password in secretFile) when user is not empty. The
// reply subjects are the service's own (natsauth.ServiceInboxPrefix): under the auth callout a
// service may subscribe to no other replies.
func ConnectAs(ctx context.Context, url, user, secretFile, name string, log *zap.Logger) (*nats.Conn, jetstream.JetStream, error) {
	tokenFile := secretFile
	opts := append([]nats.Option{
		nats.Name(name),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(name)),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
	}, natsmetrics.ConnectionOptions(
		func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", zap.Error(err))
			}
		},
		func(nc *nats.Conn) { log.Info("nats reconnected", zap.String("url", nc.ConnectedUrl())) },
	)...)
	if tokenFile != "" {
		tok, err := ReadSecretFile(tokenFile)
		if err != nil {
			return nil, nil, err
		}
		if user != "" {
			opts = append(opts, nats.UserInfo(user, tok))
		} else {
			opts = append(opts, nats.Token(tok))
		}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to nats %s: %w", url, err)
	}
	for !nc.IsConnected() {
		select {
		case <-ctx.Done():
			nc.Close()
			return nil, nil, fmt.Errorf("connect to nats %s: %w", url, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// Env is what a service's start function gets.
type Env struct {
	Options *Options
	Log     *zap.Logger
	Conn    *nats.Conn
	JS      jetstream.JetStream
	Server  *server.Server
	// Authz is the authorizer of Server's APIs, for a listener of another protocol (the xDS
	// server's gRPC) that must apply the same table; nil for a service without an API (NoAPI).
	Authz *authz.Authorizer
	// Group runs the service's long-lived loops; the first error stops the process.
	Group *errgroup.Group
}

// StartFunc constructs a daemon's components (server.Component: mounted on env.Server and run
// in env.Group by Main); anything else long-lived it may run in env.Group itself.
type StartFunc func(ctx context.Context, env *Env) ([]server.Component, error)

// NoAPI is implemented by the configuration of a service whose daemon serves no API (the kube
// bridge): Main then starts no API authorizer and records no denied calls, which such a
// service's NATS identity is not granted (pkg/natsauth's servicesWithoutAPI).
type NoAPI interface{ ServesNoAPI() bool }

// Main parses the shared flags and the service's (flags), checks them, sets everything up,
// calls start and runs the components it returns. It returns the process exit code: 2 for a
// bad flag, with the error naming it.
func Main(name string, args []string, flags flagcheck.Flags, start StartFunc) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var o Options
	if code, ok := Parse(fs, args, &o, flags); !ok {
		return code
	}
	log, err := logging.New(o.LogLevel, o.LogConsole)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	log.Info("starting", zap.String("service", name), zap.String("version", version.Version))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	noAPI := false
	if n, ok := flags.(NoAPI); ok {
		noAPI = n.ServesNoAPI()
	}
	if err := run(ctx, name, &o, log, noAPI, start); err != nil {
		log.Error("exiting", zap.Error(err))
		return 1
	}
	return 0
}

// Parse registers the shared flags (o) and the service's into fs, parses args and checks the
// values; with ok false the process exits with code (0 for -help, else 2, the error printed).
func Parse(fs *flag.FlagSet, args []string, o *Options, flags flagcheck.Flags) (code int, ok bool) {
	o.Register(fs)
	flags.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if err := errors.Join(o.Validate(), flags.Validate()); err != nil {
		fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
		return 2, false
	}
	return 0, true
}

func run(ctx context.Context, name string, o *Options, log *zap.Logger, noAPI bool, start StartFunc) error {
	srv, err := server.New(o.Server, log)
	if err != nil {
		return err
	}
	nc, js, err := ConnectAs(ctx, o.NATSURL, o.NATSUser, o.NATSTokenFile, name, log)
	if err != nil {
		return err
	}
	defer nc.Drain()
	srv.Registry().MustRegister(natsmetrics.Collectors()...)
	srv.AddCheck("nats", func(context.Context) error {
		if !nc.IsConnected() {
			return errors.New("not connected")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)
	var az *authz.Authorizer
	if !noAPI {
		azCfg := o.Authz
		if o.Server.InsecureDev {
			azCfg = azCfg.ForInsecureDev()
		}
		az = authz.New(js, azCfg, log)
		// Every process serving an API records what its authorizer denies as audit activity.
		denials := audit.NewDenialRecorder(js, audit.DefaultDenialLimits, log)
		srv.Registry().MustRegister(denials.Collectors()...)
		az.RecordDenials(denials)
		g.Go(func() error { return denials.Run(ctx) })
		srv.Authorize(az.Interceptor())
		srv.ReadyWhen("authz", az.Ready())
		g.Go(func() error { return az.Run(ctx) })
	}
	env := &Env{Options: o, Log: log, Conn: nc, JS: js, Server: srv, Authz: az, Group: g}
	cs, err := start(ctx, env)
	if err != nil {
		cancel() // stop what started (the authorizer, anything start ran in env.Group)
		_ = g.Wait()
		return err
	}
	server.Start(ctx, g, srv, cs...)
	g.Go(func() error { return srv.Serve(ctx) })
	return g.Wait()
}
