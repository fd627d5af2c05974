package clusterimport

import "flag"

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
