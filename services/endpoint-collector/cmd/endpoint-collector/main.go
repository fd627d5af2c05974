// Command endpoint-collector merges the EndpointSlices cluster agents report into one
// multi-cluster view per service and serves it (fleetstream.endpoint.v1.EndpointService, and
// xDS for proxies with --xds-listen).
package main

import (
	"context"
	"errors"
	"flag"
	"os"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/mcs"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/xds"
)

func main() {
	var o options
	os.Exit(daemon.Main("endpoint-collector", os.Args[1:], &o, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		c, err := collector.NewFromEnv(ctx, env, o.cfg)
		if err != nil {
			return nil, err
		}
		m := mcs.NewFromEnv(env, c, o.cfg.NoViewWrites)
		x, _, err := xds.Listen(ctx, env, c, o.xdsListen)
		switch {
		case err != nil:
			return nil, err
		case x == nil: // no --xds-listen
			return []server.Component{c, m}, nil
		}
		return []server.Component{c, m, x}, nil
	}))
}

// options are the binary's flags: the collector's own (fleetd takes the same ones) and where
// to serve xDS (fleetd too, with a default of its own).
type options struct {
	cfg       collector.Config
	xdsListen string
}

func (o *options) RegisterFlags(fs *flag.FlagSet) {
	o.cfg.RegisterFlags(fs)
	xds.RegisterListenFlag(fs, &o.xdsListen, os.Getenv("FLEETSTREAM_XDS_LISTEN"))
}

func (o *options) Validate() error {
	return errors.Join(o.cfg.Validate(), xds.ValidateListen(o.xdsListen))
}
