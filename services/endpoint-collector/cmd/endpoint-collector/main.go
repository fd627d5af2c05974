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
	var o options
	os.Exit(daemon.Main("endpoint-collector", os.Args[1:], o.register, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		cfg, xdsListen := o.cfg, o.xdsListen
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

// options are the binary's flags: the collector's own (fleetd takes the same ones) and where
// to serve xDS.
type options struct {
	cfg       collector.Config
	xdsListen string
}

func (o *options) register(fs *flag.FlagSet) {
	o.cfg.RegisterFlags(fs)
	fs.StringVar(&o.xdsListen, "xds-listen", os.Getenv("FLEETSTREAM_XDS_LISTEN"), "host:port of the xDS server (gRPC: ADS, EDS, CDS, LDS, RDS) for proxies; empty serves no xDS")
}
