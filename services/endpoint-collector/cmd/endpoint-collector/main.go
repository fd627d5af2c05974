// Command endpoint-collector merges the EndpointSlices cluster agents report into one
// multi-cluster view per service and serves it (fleetstream.endpoint.v1.EndpointService, and
// xDS for proxies with --xds-listen).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/xds"
)

func main() {
	var cfg collector.Config
	var xdsListen string
	os.Exit(daemon.Main("endpoint-collector", os.Args[1:], func(fs *flag.FlagSet) {
		fs.DurationVar(&cfg.StaleAfter, "stale-after", 0, "agent silence before a cluster's endpoints are flagged stale (default 30s)")
		fs.DurationVar(&cfg.EvictAfter, "evict-after", 0, "agent silence before a cluster's endpoints are no longer served (default 5m)")
		fs.DurationVar(&cfg.WeightCleanupAfter, "weight-cleanup-after", 0, "how long an endpoint weight outlives its endpoint (default 1h)")
		fs.DurationVar(&cfg.ViewFlushInterval, "view-flush-interval", 0, "coalescing interval of bucket `endpoints` writes (default 200ms)")
		fs.BoolVar(&cfg.NoViewWrites, "no-view-writes", false, "serve only: never take the writer lease (bucket writes, weight cleanup); replicas elect a writer without it")
		fs.IntVar(&cfg.Workers, "workers", 0, "concurrent reconcilers (default 2)")
		fs.Int64Var(&cfg.ResponseCacheBytes, "response-cache-bytes", 0, "memory for cached GetServiceEndpoints responses, hot services first (default: 64 bytes per address held, 4 to 32 MiB; -1 caches nothing)")
		cfg.Limits.RegisterFlags(fs)
		fs.StringVar(&xdsListen, "xds-listen", os.Getenv("FLEETSTREAM_XDS_LISTEN"), "host:port of the xDS server (gRPC: ADS, EDS, CDS, LDS, RDS) for proxies; empty serves no xDS")
	}, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		cfg.Replicas = env.Options.Replicas
		cfg.Retention = env.Options.Retention
		c, err := collector.New(ctx, env.JS, cfg, env.Log)
		if err != nil {
			return nil, err
		}
		c.UseOwnership(env.Authz) // endpoints merge per owning project, from the authorizer's bindings view
		if xdsListen == "" {
			return []server.Component{c}, nil
		}
		ln, err := net.Listen("tcp", xdsListen)
		if err != nil {
			return nil, fmt.Errorf("--xds-listen %s: %w", xdsListen, err)
		}
		x := xds.New(c, env.Server.Authenticator(), env.Authz, env.Log)
		env.Group.Go(func() error { return x.Serve(ctx, ln) })
		return []server.Component{c, x}, nil
	}))
}
