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
	os.Exit(daemon.Main("namespace-binding", os.Args[1:], cfg.RegisterFlags, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		cfg.Replicas = env.Options.Replicas
		cfg.Retention = env.Options.Retention
		svc, err := namespacebinding.New(ctx, env.JS, cfg, env.Log)
		if err != nil {
			return nil, err
		}
		return []server.Component{svc}, nil
	}))
}
