package collector

import (
	"context"
	"errors"
	"flag"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck"
)

// RegisterFlags adds the collector's flags to fs: endpoint-collector's and fleetd's, so both
// take the same names and defaults (0 and false leave the defaults of Config to New).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.StaleAfter, "stale-after", 0, "agent silence before a cluster's endpoints are flagged stale (default 40s)")
	fs.DurationVar(&c.EvictAfter, "evict-after", 0, "agent silence before a cluster's endpoints are no longer served (default 5m)")
	fs.DurationVar(&c.WeightCleanupAfter, "weight-cleanup-after", 0, "how long an endpoint weight outlives its endpoint (default 1h)")
	fs.DurationVar(&c.ViewFlushInterval, "view-flush-interval", 0, "coalescing interval of bucket `endpoints` writes (default 200ms)")
	fs.BoolVar(&c.NoViewWrites, "no-view-writes", false, "serve only: never take the writer lease (bucket writes, weight cleanup); replicas elect a writer without it")
	fs.IntVar(&c.Workers, "workers", 0, "concurrent reconcilers (default 2)")
	fs.Int64Var(&c.ResponseCacheBytes, "response-cache-bytes", 0, "memory for cached GetServiceEndpoints responses, hot services first (default: 64 bytes per address held, 4 to 32 MiB; -1 caches nothing)")
	c.Limits.RegisterFlags(fs)
}

// Validate checks the values of the flags RegisterFlags adds, naming the flag of a bad one.
func (c *Config) Validate() error {
	var cacheBytes error
	if c.ResponseCacheBytes < -1 {
		cacheBytes = errors.New("--response-cache-bytes: want -1 (no cache), 0 (the default) or a size in bytes")
	}
	var evict error
	if c.StaleAfter > 0 && c.EvictAfter > 0 && c.EvictAfter < c.StaleAfter {
		evict = errors.New("--evict-after must not be shorter than --stale-after: endpoints are flagged stale before they go")
	}
	return errors.Join(
		flagcheck.NotNegative("stale-after", c.StaleAfter),
		flagcheck.NotNegative("evict-after", c.EvictAfter),
		evict,
		flagcheck.NotNegative("weight-cleanup-after", c.WeightCleanupAfter),
		flagcheck.NotNegative("view-flush-interval", c.ViewFlushInterval),
		flagcheck.NotNegative("workers", c.Workers),
		cacheBytes,
		flagcheck.NotNegative("max-endpoint-slices-per-cluster", c.Limits.MaxEndpointSlicesPerCluster),
		flagcheck.NotNegative("max-endpoints-per-cluster", c.Limits.MaxEndpointsPerCluster),
	)
}

// NewFromEnv constructs the collector as its binary and fleetd run it: on env's connection, with
// env's stream replicas and retention, merging endpoints per owning project as env's authorizer
// sees the namespace bindings.
func NewFromEnv(ctx context.Context, env *daemon.Env, cfg Config) (*Collector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Replicas, cfg.Retention = env.Options.Replicas, env.Options.Retention
	c, err := New(ctx, env.JS, cfg, env.Log)
	if err != nil {
		return nil, err
	}
	c.UseOwnership(env.Authz)
	return c, nil
}
