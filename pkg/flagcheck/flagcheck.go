// Package flagcheck holds the checks of flag values the services' Validate methods share: each
// error names the flag and the value, so it is the whole message. A flag's value is an
// operator's setting, never a secret (files hold those, and only their paths are flags).
package flagcheck

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Flags are a service's options as its binary and fleetd both take them: each service's Config
// registers its flags and checks the values given, naming the flag of a bad one.
type Flags interface {
	RegisterFlags(fs *flag.FlagSet)
	Validate() error
}

// NotNegative is an error for a negative v of --name: durations, counts and sizes whose 0
// means "the default".
func NotNegative[T ~int | ~int64](name string, v T) error {
	if v < 0 {
		return fmt.Errorf("--%s %v: must not be negative (0 takes the default)", name, formatValue(v))
	}
	return nil
}

func formatValue[T ~int | ~int64](v T) string {
	if d, ok := any(v).(time.Duration); ok {
		return d.String()
	}
	return strconv.FormatInt(int64(v), 10)
}

// HostPort is an error for a v of --name that is not host:port (an empty host listens on every
// interface); an empty v is an error only if required.
func HostPort(name, v string, required bool) error {
	if v == "" {
		if required {
			return fmt.Errorf("--%s is required", name)
		}
		return nil
	}
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("--%s %q: want host:port: %w", name, v, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("--%s %q: port %q is not a number from 0 to 65535", name, v, port)
	}
	return nil
}

// natsSchemes are those nats.go connects with; a URL without a scheme is nats://.
var natsSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// NATSURLs is an error for a v of --name that is not a comma-separated list of NATS server URLs
// as nats.go takes them: [scheme://][user[:password]@]host:port.
func NATSURLs(name, v string) error {
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("--%s is required", name)
	}
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		full := s
		if !strings.Contains(s, "://") {
			full = "nats://" + s
		}
		u, err := url.Parse(full)
		if err != nil {
			// The URL may carry a password: a value that does not parse is not quoted back, only
			// what is wrong with it (url.Error's inner error names the part, not the URL).
			return fmt.Errorf("--%s: a URL that does not parse: %w", name, errors.Unwrap(err))
		}
		// A URL may carry user:password; what is quoted back has the password masked.
		shown := s
		if u.User != nil {
			shown = strings.Replace(s, u.User.String()+"@", redactedUser(u)+"@", 1)
		}
		if !natsSchemes[u.Scheme] {
			return fmt.Errorf("--%s %q: scheme %q, want nats, tls, ws or wss", name, shown, u.Scheme)
		}
		if u.Hostname() == "" {
			return fmt.Errorf("--%s %q: no host", name, shown)
		}
	}
	return nil
}

// redactedUser is u's user with its password, if any, masked.
func redactedUser(u *url.URL) string {
	if _, ok := u.User.Password(); ok {
		return u.User.Username() + ":xxxxx"
	}
	return u.User.Username()
}
