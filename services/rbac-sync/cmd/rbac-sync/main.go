// Command rbac-sync runs the role template and project role binding service against a NATS
// cluster: the RBACService API and the fan-out of desired ClusterRoles and RoleBindings, and
// the audit trail (AuditService and its index, pkg/audit).
package main

import (
	"context"
	"os"

	"github.com/fleetstream/fleetstream/pkg/audit"
	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

func main() {
	var cfg rbacsync.Config
	os.Exit(daemon.Main("rbac-sync", os.Args[1:], &cfg, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		svc, err := rbacsync.NewFromEnv(ctx, env, cfg)
		if err != nil {
			return nil, err
		}
		// The audit trail (pkg/audit) is served here: rbac-sync already answers the other
		// question of the past, AccessAt (docs/architecture.md, "Audit trail").
		trail, err := audit.New(ctx, env.JS, audit.Config{Replicas: env.Options.Replicas, Retention: env.Options.Retention}, env.Log)
		if err != nil {
			return nil, err
		}
		return []server.Component{svc, trail}, nil
	}))
}
