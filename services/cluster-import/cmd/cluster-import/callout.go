package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// calloutOptions configure the NATS auth callout responder cluster-import runs for a NATS
// cluster configured with `authorization { auth_callout { … } }`.
type calloutOptions struct {
	issuerSeedFile    string
	xkeySeedFile      string
	serviceTokensFile string
	account           string
	validFor          time.Duration
	systemUser        string
}

func (o *calloutOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.issuerSeedFile, "nats-callout-issuer-seed-file", os.Getenv("FLEETSTREAM_NATS_CALLOUT_ISSUER_SEED_FILE"),
		"account nkey seed signing auth callout answers (its public key is the callout's issuer); empty runs no responder")
	fs.StringVar(&o.xkeySeedFile, "nats-callout-xkey-seed-file", os.Getenv("FLEETSTREAM_NATS_CALLOUT_XKEY_SEED_FILE"),
		"curve nkey seed: requests and answers are encrypted (its public key is the callout's xkey)")
	fs.StringVar(&o.serviceTokensFile, "nats-service-tokens-file", os.Getenv("FLEETSTREAM_NATS_SERVICE_TOKENS_FILE"),
		"NATS tokens of the hub services, `token,service` per line: each gets only its service's permissions")
	fs.StringVar(&o.account, "nats-callout-account", "$G", "NATS account admitted clients are placed in")
	fs.DurationVar(&o.validFor, "nats-callout-valid-for", time.Hour,
		"how long an admitted connection stays authorized before it must reconnect (bounds how long a revoked token's connections live without --nats-system-user)")
	fs.StringVar(&o.systemUser, "nats-system-user", os.Getenv("FLEETSTREAM_NATS_SYSTEM_USER"),
		"NATS system account user (password: the --nats-token-file) that closes a deregistered cluster's agent's and a deleted subscriber's open connections on every server; empty leaves them open until --nats-callout-valid-for ends")
}

func (o *calloutOptions) validate() error {
	switch {
	case o.validFor < 0:
		return fmt.Errorf("--nats-callout-valid-for %v: must not be negative", o.validFor)
	case o.issuerSeedFile != "" && o.account == "":
		return fmt.Errorf("--nats-callout-account is required with --nats-callout-issuer-seed-file")
	}
	return nil
}

// kicker connects as the system account user, when one is configured: revocation then reaches
// open connections on every server of the NATS cluster.
func (o *calloutOptions) kicker(ctx context.Context, env *daemon.Env) (natsauth.Kicker, error) {
	if o.systemUser == "" {
		return nil, nil
	}
	opts := env.Options
	// Bounded: a NATS config without that user refuses it for ever, which must stop the start
	// with an error rather than hang it.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	nc, _, err := daemon.ConnectAs(cctx, opts.NATSURL, o.systemUser, opts.NATSTokenFile, o.systemUser, env.Log.Named("nats-system"))
	if err != nil {
		return nil, fmt.Errorf("--nats-system-user: %w", err)
	}
	env.Group.Go(func() error {
		<-ctx.Done()
		nc.Close()
		return nil
	})
	return &natsauth.SystemKicker{Conn: nc}, nil
}

// start runs the responder on env's connection, which must be one of the callout's auth_users
// (--nats-user): the responder is what lets every other client in.
func (o *calloutOptions) start(ctx context.Context, env *daemon.Env, svc *clusterimport.Registry) error {
	if o.issuerSeedFile == "" {
		return nil
	}
	issuer, err := natsauth.LoadKeyFile(o.issuerSeedFile)
	if err != nil {
		return err
	}
	var xkey nkeys.KeyPair
	if o.xkeySeedFile != "" {
		if xkey, err = natsauth.LoadKeyFile(o.xkeySeedFile); err != nil {
			return err
		}
	}
	var tokens *natsauth.ServiceTokens
	if o.serviceTokensFile != "" {
		if tokens, err = natsauth.LoadServiceTokens(o.serviceTokensFile); err != nil {
			return err
		}
	}
	r := &natsauth.Responder{Issuer: issuer, XKey: xkey, Account: o.account, ValidFor: o.validFor,
		Resolve: svc.NATSResolver(tokens), Log: env.Log.Named("nats-auth-callout")}
	env.Group.Go(func() error { return r.Run(ctx, env.Conn) })
	return nil
}
