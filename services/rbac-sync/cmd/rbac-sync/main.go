// Command rbac-sync runs the role template and project role binding service against a NATS
// cluster: the RBACService API and the fan-out of desired ClusterRoles and RoleBindings.
package main

import (
	"context"
	"os"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

func main() {
	var cfg rbacsync.Config
	os.Exit(daemon.Main("rbac-sync", os.Args[1:], nil, func(ctx context.Context, env *daemon.Env) error {
		cfg.Replicas = env.Options.Replicas
		svc, err := rbacsync.New(ctx, env.JS, cfg, env.Log)
		if err != nil {
			return err
		}
		svc.Mount(env.Server)
		env.Group.Go(func() error { return svc.Run(ctx) })
		return nil
	}))
}
