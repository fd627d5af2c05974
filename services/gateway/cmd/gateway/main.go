// Command gateway is Fleetstream's one API front door: it routes Connect, gRPC and gRPC-Web
// calls by service to the processes that serve them (see package gateway). It needs no NATS, so
// it does not use pkg/daemon; its flags are named like every service's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/flagcheck"
	"github.com/fleetstream/fleetstream/pkg/logging"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/gateway/gateway"
)

func main() { os.Exit(run(os.Args[1:])) }

// routeFlag collects repeated --route service=url values.
type routeFlag map[string]string

func (f routeFlag) String() string {
	parts := make([]string, 0, len(f))
	for s, u := range f {
		parts = append(parts, s+"="+u)
	}
	return strings.Join(parts, ",")
}

func (f routeFlag) Set(v string) error {
	svc, up, err := gateway.ParseRoute(v)
	if err != nil {
		return err
	}
	if prev, ok := f[svc]; ok && prev != up {
		return fmt.Errorf("route %s given twice (%s and %s): one upstream per service", svc, prev, up)
	}
	f[svc] = up
	return nil
}

func run(args []string) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	var (
		srvCfg     server.Config
		gwCfg      = gateway.Config{Routes: map[string]string{}}
		logLevel   string
		logConsole bool
	)
	// The services' own listener flags and defaults (the token file is theirs too).
	srvCfg.RegisterFlags(fs, server.EnvDefaults())
	fs.Var(routeFlag(gwCfg.Routes), "route", "`service=url`: send calls of this fully-qualified service to this upstream, e.g. fleetstream.cluster.v1.ClusterService=http://cluster-import:8080 (repeat for every service)")
	gwCfg.Console.RegisterFlags(fs)
	fs.DurationVar(&gwCfg.PollInterval, "upstream-check-interval", gateway.DefaultPollInterval, "how often each upstream's /readyz is polled")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&logConsole, "log-console", false, "human-readable logs instead of JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := errors.Join(srvCfg.Validate(), gwCfg.Console.Validate(), flagcheck.NotNegative("upstream-check-interval", gwCfg.PollInterval)); err != nil {
		fmt.Fprintf(os.Stderr, "gateway: %v\n", err)
		return 2
	}
	gwCfg.MaxRequestBytes = int64(srvCfg.MaxRequestBytes)
	log, err := logging.New(logLevel, logConsole)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway: %v\n", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	accessLog, accessBuf, err := newAccessLog(logLevel, logConsole, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway: %v\n", err)
		return 2
	}
	gwCfg.AccessLog = accessLog
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	flushCtx, stopFlush := context.WithCancel(context.Background())
	flushed := make(chan struct{})
	go func() { defer close(flushed); accessBuf.run(flushCtx, accessLogFlush) }()
	// The last lines are written before the process ends, whatever ends it but a kill.
	defer func() { stopFlush(); <-flushed }()
	if err := serve(ctx, srvCfg, gwCfg, log); err != nil {
		log.Error("exiting", zap.Error(err))
		return 1
	}
	return 0
}

func serve(ctx context.Context, srvCfg server.Config, gwCfg gateway.Config, log *zap.Logger) error {
	srv, err := server.New(srvCfg, log)
	if err != nil {
		return err
	}
	gw, err := gateway.New(gwCfg, srv.Authenticator(), srv.Registry(), log)
	if err != nil {
		return err
	}
	gw.Mount(srv)
	for svc, up := range gwCfg.Routes {
		log.Info("route", zap.String("service", svc), zap.String("upstream", up))
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return gw.Run(ctx) })
	g.Go(func() error { return srv.Serve(ctx) })
	return g.Wait()
}
