package server

import "github.com/fleetstream/fleetstream/pkg/flagcheck"

// Validate checks the values the flags of a server binary gave, naming the flag of a bad one:
// what New would otherwise refuse only once the process is starting, or not at all.
func (c Config) Validate() error {
	if err := flagcheck.HostPort("listen", c.Listen, true); err != nil {
		return err
	}
	if err := flagcheck.NotNegative("max-request-bytes", c.MaxRequestBytes); err != nil {
		return err
	}
	if c.OIDC.enabled() {
		return c.OIDC.validate()
	}
	return nil
}
