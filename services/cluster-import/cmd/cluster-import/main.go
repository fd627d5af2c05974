// Command cluster-import runs the cluster registry service against a NATS cluster.
package main

import (
	"context"
	"flag"
	"os"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

func main() {
	var cfg clusterimport.Config
	os.Exit(daemon.Main("cluster-import", os.Args[1:], func(fs *flag.FlagSet) {
		fs.DurationVar(&cfg.UnreachableAfter, "unreachable-after", 0, "time without heartbeat before a cluster is tainted unreachable (default 30s)")
	}, func(ctx context.Context, env *daemon.Env) error {
		cfg.Replicas = env.Options.Replicas
		svc, err := clusterimport.New(ctx, env.JS, cfg, env.Log)
		if err != nil {
			return err
		}
		svc.Mount(env.Server)
		env.Group.Go(func() error { return svc.Run(ctx) })
		return nil
	}))
}
