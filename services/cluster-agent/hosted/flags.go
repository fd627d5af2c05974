package hosted

import (
	"errors"
	"flag"

	"github.com/fleetstream/fleetstream/pkg/flagcheck"
)

// RegisterFlags adds the hosted agents' flags to fs: cluster-agent's and fleetd's, so both take
// the same names and defaults. They are every hosted agent's (Member) and the supervisor's;
// NATS is the binary's (fleetd's hosted agents connect in process).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.InClusterGrace, "in-cluster-grace", DefaultInClusterGrace, "a hosted agent leaves its cluster to the cluster's own agent while that sent a heartbeat within this")
	c.Credentials.RegisterFlags(fs)
	c.Member.RegisterFlags(fs)
}

// Validate checks the values of the flags RegisterFlags adds, naming the flag of a bad one.
func (c *Config) Validate() error {
	return errors.Join(
		flagcheck.NotNegative("in-cluster-grace", c.InClusterGrace),
		c.Credentials.Validate(),
		c.Member.Validate(),
	)
}
