package server

import (
	"flag"
	"os"

	"github.com/fleetstream/fleetstream/pkg/flagcheck"
)

// RegisterFlags adds the flags of the HTTP listener and its authentication to fs (every service,
// fleetd and the gateway), with def's Listen and TokenFile as defaults: a service's binary takes
// them from its environment, fleetd does not.
func (c *Config) RegisterFlags(fs *flag.FlagSet, def Config) {
	fs.StringVar(&c.Listen, "listen", def.Listen, "host:port of the HTTP listener (APIs, /healthz, /readyz, /metrics)")
	fs.StringVar(&c.TokenFile, "token-file", def.TokenFile, "bearer tokens allowed to call the APIs (token,user per line)")
	fs.BoolVar(&c.InsecureDev, "insecure-dev", false, "serve the APIs without authentication (development only)")
	fs.IntVar(&c.MaxRequestBytes, "max-request-bytes", DefaultMaxRequestBytes, "largest request message accepted; larger ones are refused with resource_exhausted")
	c.OIDC.RegisterFlags(fs)
}

// EnvDefaults are the defaults of a binary's listener flags (a service's, the gateway's): from
// its environment, FLEETSTREAM_LISTEN and FLEETSTREAM_TOKEN_FILE, else 127.0.0.1:8080.
func EnvDefaults() Config {
	c := Config{Listen: os.Getenv("FLEETSTREAM_LISTEN"), TokenFile: os.Getenv("FLEETSTREAM_TOKEN_FILE")}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	return c
}

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
