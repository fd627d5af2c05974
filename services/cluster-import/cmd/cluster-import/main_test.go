package main

import (
	"flag"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck/flagchecktest"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// TestBinaryFlagsReachFleetd: every flag of the binary is the daemon's, clusterimport.Config's
// (which fleetd registers too: services/fleetd/cmd/fleetd's TestFlagsOfEveryService) or
// listed below with why fleetd has no use for it. A flag registered here and nowhere else
// fails: fleetd would not get it.
func TestBinaryFlagsReachFleetd(t *testing.T) {
	binaryOnly := map[string]string{
		"credentials-key-file": "fleetd has its daemonFlags, defaulting to a key file in its data dir",
		// fleetd's embedded NATS server authenticates clients in process and closes revoked
		// connections itself: no auth callout, no system user.
		"nats-callout-issuer-seed-file": "no auth callout in fleetd",
		"nats-callout-xkey-seed-file":   "no auth callout in fleetd",
		"nats-callout-account":          "no auth callout in fleetd",
		"nats-callout-valid-for":        "no auth callout in fleetd",
		"nats-service-tokens-file":      "fleetd's services share its in-process connection",
		"nats-system-user":              "fleetd kicks revoked connections on its embedded server",
	}
	var o options
	var d daemon.Options
	flagchecktest.SharedFlags(t, func(fs *flag.FlagSet) { new(daemon.Options).Register(fs); o.RegisterFlags(fs) },
		[]func(*flag.FlagSet){d.Register, new(clusterimport.Config).RegisterFlags}, binaryOnly)
}
