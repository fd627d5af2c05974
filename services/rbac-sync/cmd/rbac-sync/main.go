// Command rbac-sync runs the role template and project role binding service against a NATS
// cluster: the RBACService API and the fan-out of desired ClusterRoles and RoleBindings.
package main

import (
	"context"
	"flag"
	"os"
	"strings"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

func main() {
	var cfg rbacsync.Config
	var admins string
	os.Exit(daemon.Main("rbac-sync", os.Args[1:], func(fs *flag.FlagSet) {
		fs.StringVar(&admins, "platform-admins", os.Getenv("FLEETSTREAM_PLATFORM_ADMINS"),
			"comma-separated API users (as the token file names them) who manage role templates and may grant any role")
	}, func(ctx context.Context, env *daemon.Env) error {
		cfg.Replicas = env.Options.Replicas
		cfg.PlatformAdmins = splitList(admins)
		svc, err := rbacsync.New(ctx, env.JS, cfg, env.Log)
		if err != nil {
			return err
		}
		svc.Mount(env.Server)
		env.Group.Go(func() error { return svc.Run(ctx) })
		return nil
	}))
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
