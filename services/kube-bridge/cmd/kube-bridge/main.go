// Command kube-bridge publishes the fleet onto a hub Kubernetes API server: a ClusterProfile
// (multicluster.x-k8s.io/v1alpha1) per registered cluster and OCM PlacementDecisions
// (cluster.open-cluster-management.io/v1beta1) per placement decision (docs/kubernetes.md). It
// connects to NATS as the kube-bridge service, which may read the views it mirrors and write
// nothing but its own lease: any number may run per hub, and the holder of the hub's lease writes.
package main

import (
	"context"
	"os"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
)

func main() {
	var cfg kubebridge.Config
	os.Exit(daemon.Main("kube-bridge", os.Args[1:], &cfg, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		b, err := kubebridge.NewFromEnv(ctx, env, cfg)
		if err != nil {
			return nil, err
		}
		return []server.Component{b}, nil
	}))
}
