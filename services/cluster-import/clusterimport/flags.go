package clusterimport

import (
	"context"
	"errors"
	"flag"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck"
)

// RegisterFlags adds the registry's flags to fs: cluster-import's and fleetd's, so both take
// the same names and defaults (0 leaves the defaults of Config to New). The key file and the
// NATS auth callout are the binary's own: fleetd keeps its key in its data dir and
// authenticates NATS clients in process.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.UnreachableAfter, "unreachable-after", 0, "time without heartbeat before a cluster is tainted unreachable (default 40s)")
	c.AgentLimits.RegisterFlags(fs)
	fs.DurationVar(&c.PolicyClaimGrace, "policy-claim-grace", 0, "age after which an import policy's claim on its source, the policy never created, may be taken over (default 2m)")
	c.Credentials.RegisterFlags(fs)
}

// Validate checks the values of the flags RegisterFlags adds, naming the flag of a bad one.
func (c *Config) Validate() error {
	return errors.Join(
		flagcheck.NotNegative("unreachable-after", c.UnreachableAfter),
		flagcheck.NotNegative("policy-claim-grace", c.PolicyClaimGrace),
		flagcheck.NotNegative("max-agent-report-subjects-per-cluster", c.AgentLimits.MaxReportSubjectsPerCluster),
		flagcheck.NotNegative("max-agent-report-bytes-per-cluster", c.AgentLimits.MaxReportBytesPerCluster),
		c.Credentials.Validate(),
	)
}

// NewFromEnv constructs the registry as its binary and fleetd run it: on env's connection, with
// env's stream replicas and retention. The caller gives the Keyring (and the Kicker, if any);
// without a Keyring, --insecure-dev stores credentials unsealed and anything else is refused.
func NewFromEnv(ctx context.Context, env *daemon.Env, cfg Config) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Replicas, cfg.Retention = env.Options.Replicas, env.Options.Retention
	if cfg.Keyring == nil && env.Options.Server.InsecureDev {
		cfg.PlaintextCredentials = true
	}
	return New(ctx, env.JS, cfg, env.Log)
}
