package namespacebinding

import "flag"

// RegisterFlags adds the project service's flags to fs: namespace-binding's and fleetd's, so
// both take the same names and defaults (0 leaves the defaults of Config to New).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.ClaimGrace, "claim-grace", 0, "age after which a claim whose bind never completed is released (default 2m)")
	fs.DurationVar(&c.ScoreRefresh, "placement-score-refresh", 0, "least time between two stored decisions of a placement that change only its scores or its re-evaluation time (default 10s)")
	c.Protected.RegisterFlags(fs)
}
