package server

import (
	"fmt"
	"net"
	"strconv"
)

// Validate checks the values the flags of a server binary gave, naming the flag of a bad one:
// what New would otherwise refuse only once the process is starting, or not at all.
func (c Config) Validate() error {
	if c.Listen == "" {
		return fmt.Errorf("--listen is required")
	}
	if _, port, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: want host:port: %w", c.Listen, err)
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("--listen %q: port %q is not a number from 0 to 65535", c.Listen, port)
	}
	if c.MaxRequestBytes < 0 {
		return fmt.Errorf("--max-request-bytes %d: must not be negative (0 takes the default)", c.MaxRequestBytes)
	}
	if c.OIDC.enabled() {
		return c.OIDC.validate()
	}
	return nil
}
