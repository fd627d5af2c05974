package namespacebinding

import "flag"

// RegisterFlags adds the project service's flags to fs: namespace-binding's and fleetd's, so
// both take the same names and defaults (0 leaves the defaults of Config to New).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.ClaimGrace, "claim-grace", 0, "age after which a claim whose bind never completed is released (default 2m)")
	c.Protected.RegisterFlags(fs)
}
