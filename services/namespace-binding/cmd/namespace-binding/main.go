// Command namespace-binding runs the project service (projects, namespace bindings, quotas and
// the desired Namespaces and ResourceQuotas of member clusters) against a NATS cluster.
package main

import (
	"context"
	"os"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

func main() {
	var cfg namespacebinding.Config
	os.Exit(daemon.Main("namespace-binding", os.Args[1:], &cfg, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		svc, err := namespacebinding.NewFromEnv(ctx, env, cfg)
		if err != nil {
			return nil, err
		}
		return []server.Component{svc}, nil
	}))
}
