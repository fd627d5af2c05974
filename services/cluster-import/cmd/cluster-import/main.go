// Command cluster-import runs the cluster registry service against a NATS cluster.
//
//	cluster-import [flags]                          run the service
//	cluster-import rotate-credentials-key [flags]   reseal stored credentials with the active key
package main

import (
	"context"
	"errors"
	"flag"
	"os"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/sealed"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "rotate-credentials-key" {
		os.Exit(rotate(os.Args[2:]))
	}
	var cfg clusterimport.Config
	var callout calloutOptions
	var keyFile string
	os.Exit(daemon.Main("cluster-import", os.Args[1:], func(fs *flag.FlagSet) {
		callout.register(fs)
		fs.DurationVar(&cfg.UnreachableAfter, "unreachable-after", 0, "time without heartbeat before a cluster is tainted unreachable (default 30s)")
		cfg.AgentLimits.RegisterFlags(fs)
		fs.DurationVar(&cfg.PolicyClaimGrace, "policy-claim-grace", 0, "age after which an import policy's claim on its source, the policy never created, may be taken over (default 2m)")
		fs.StringVar(&keyFile, "credentials-key-file", os.Getenv("FLEETSTREAM_CREDENTIALS_KEY_FILE"), keyFileUsage)
		cfg.Credentials.RegisterFlags(fs)
	}, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		cfg.Replicas = env.Options.Replicas
		cfg.Retention = env.Options.Retention
		switch {
		case keyFile != "":
			ring, err := sealed.LoadKeyring(keyFile)
			if err != nil {
				return nil, err
			}
			cfg.Keyring = ring
		case env.Options.Server.InsecureDev:
			cfg.PlaintextCredentials = true
		default:
			return nil, errors.New("--credentials-key-file is required (it seals cluster credentials at rest); only --insecure-dev runs without one")
		}
		kicker, err := callout.kicker(ctx, env)
		if err != nil {
			return nil, err
		}
		cfg.Kicker = kicker
		svc, err := clusterimport.New(ctx, env.JS, cfg, env.Log)
		if err != nil {
			return nil, err
		}
		if err := callout.start(ctx, env, svc); err != nil {
			return nil, err
		}
		return []server.Component{svc}, nil
	}))
}

const keyFileUsage = "file of keys that seal cluster credentials at rest, one `key-id:base64-32-bytes` per line; the first seals, all open (env FLEETSTREAM_CREDENTIALS_KEY_FILE)"
