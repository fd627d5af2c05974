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
	var o options
	os.Exit(daemon.Main("cluster-import", os.Args[1:], o.register, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		cfg, callout, keyFile := o.cfg, &o.callout, o.keyFile
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

// options are the binary's flags: the registry's own (fleetd takes the same ones), the key file
// and the NATS auth callout, which fleetd has no use for (its key lives in its data dir, its
// embedded server authenticates clients in process).
type options struct {
	cfg     clusterimport.Config
	callout calloutOptions
	keyFile string
}

func (o *options) register(fs *flag.FlagSet) {
	o.callout.register(fs)
	o.cfg.RegisterFlags(fs)
	fs.StringVar(&o.keyFile, "credentials-key-file", os.Getenv("FLEETSTREAM_CREDENTIALS_KEY_FILE"), keyFileUsage)
}

const keyFileUsage = "file of keys that seal cluster credentials at rest, one `key-id:base64-32-bytes` per line; the first seals, all open (env FLEETSTREAM_CREDENTIALS_KEY_FILE)"
