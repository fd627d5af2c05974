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
	os.Exit(daemon.Main("cluster-import", os.Args[1:], &o, func(ctx context.Context, env *daemon.Env) ([]server.Component, error) {
		cfg, callout := o.cfg, &o.callout
		if o.keyFile != "" {
			ring, err := sealed.LoadKeyring(o.keyFile)
			if err != nil {
				return nil, err
			}
			cfg.Keyring = ring
		}
		kicker, err := callout.kicker(ctx, env)
		if err != nil {
			return nil, err
		}
		cfg.Kicker = kicker
		svc, err := clusterimport.NewFromEnv(ctx, env, cfg)
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

func (o *options) RegisterFlags(fs *flag.FlagSet) {
	o.callout.register(fs)
	o.cfg.RegisterFlags(fs)
	fs.StringVar(&o.keyFile, "credentials-key-file", os.Getenv("FLEETSTREAM_CREDENTIALS_KEY_FILE"), keyFileUsage)
}

// Validate checks the flags' values; --credentials-key-file is required unless --insecure-dev,
// which the registry itself checks once it knows the daemon's flags.
func (o *options) Validate() error {
	return errors.Join(o.cfg.Validate(), o.callout.validate())
}

const keyFileUsage = "file of keys that seal cluster credentials at rest, one `key-id:base64-32-bytes` per line; the first seals, all open (env FLEETSTREAM_CREDENTIALS_KEY_FILE)"
