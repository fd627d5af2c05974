package rbacsync

import (
	"context"
	"errors"
	"flag"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck"
)

// RegisterFlags adds rbac-sync's flags to fs: its binary's and fleetd's, so both take the same
// names and defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.Snapshots.RegisterFlags(fs)
}

// Validate checks the values of the flags RegisterFlags adds, naming the flag of a bad one.
func (c *Config) Validate() error {
	return errors.Join(
		flagcheck.NotNegative("access-snapshot-max-age", c.Snapshots.MaxAge),
		flagcheck.NotNegative("access-snapshots-kept", c.Snapshots.Keep),
	)
}

// NewFromEnv constructs the service as its binary and fleetd run it: on env's connection, with
// env's stream replicas and retention.
func NewFromEnv(ctx context.Context, env *daemon.Env, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Replicas, cfg.Retention = env.Options.Replicas, env.Options.Retention
	return New(ctx, env.JS, cfg, env.Log)
}
