package xds

import (
	"context"
	"flag"
	"fmt"
	"net"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck"
)

// ListenUsage documents --xds-listen, which endpoint-collector and fleetd both take (with their
// own defaults: fleetd serves xDS by default, the collector only when asked).
const ListenUsage = "host:port of the xDS server (gRPC: ADS, EDS, CDS, LDS, RDS) serving every service's endpoints to proxies; empty serves no xDS"

// RegisterListenFlag adds --xds-listen, defaulting to def, to fs.
func RegisterListenFlag(fs *flag.FlagSet, addr *string, def string) {
	fs.StringVar(addr, "xds-listen", def, ListenUsage)
}

// ValidateListen checks --xds-listen.
func ValidateListen(addr string) error { return flagcheck.HostPort("xds-listen", addr, false) }

// Listen serves src's endpoints as xDS on addr, authenticated and authorized as env's APIs are:
// the xDS wiring of endpoint-collector's binary and of fleetd. It binds before it returns, so a
// bad or busy address fails the start, and serves in env.Group until ctx ends. The server is
// also a component of env.Server (its Run feeds it from src; its metrics and readiness mount
// there): start it with the process's others. An empty addr serves nothing (nil, "").
func Listen(ctx context.Context, env *daemon.Env, src Source, addr string) (*Server, string, error) {
	if addr == "" {
		return nil, "", nil
	}
	if err := ValidateListen(addr); err != nil {
		return nil, "", err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("--xds-listen %s: %w", addr, err)
	}
	x := New(src, env.Server.Authenticator(), env.Authz, env.Log)
	env.Group.Go(func() error { return x.Serve(ctx, ln) })
	return x, ln.Addr().String(), nil
}
