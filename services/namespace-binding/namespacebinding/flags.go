package namespacebinding

import (
	"context"
	"errors"
	"flag"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck"
)

// RegisterFlags adds the project service's flags to fs: namespace-binding's and fleetd's, so
// both take the same names and defaults (0 leaves the defaults of Config to New).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.ClaimGrace, "claim-grace", 0, "age after which a claim whose bind never completed is released (default 2m)")
	fs.DurationVar(&c.ScoreRefresh, "placement-score-refresh", 0, "least time between two stored decisions of a placement that change only its scores or its re-evaluation time (default 10s)")
	c.Protected.RegisterFlags(fs)
}

// Validate checks the values of the flags RegisterFlags adds, naming the flag of a bad one
// (--protected-namespaces is checked as it is parsed).
func (c *Config) Validate() error {
	return errors.Join(
		flagcheck.NotNegative("claim-grace", c.ClaimGrace),
		flagcheck.NotNegative("placement-score-refresh", c.ScoreRefresh),
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
