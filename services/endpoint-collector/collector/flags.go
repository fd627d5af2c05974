package collector

import "flag"

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
