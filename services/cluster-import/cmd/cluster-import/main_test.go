package main

import (
	"flag"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/daemon"
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
	bin := flag.NewFlagSet("cluster-import", flag.ContinueOnError)
	var d daemon.Options
	d.Register(bin)
	var o options
	o.RegisterFlags(bin)

	daemonFlags := flag.NewFlagSet("daemon", flag.ContinueOnError)
	var d2 daemon.Options
	d2.Register(daemonFlags)
	svc := flag.NewFlagSet("clusterimport", flag.ContinueOnError)
	var cfg clusterimport.Config
	cfg.RegisterFlags(svc)

	bin.VisitAll(func(f *flag.Flag) {
		if daemonFlags.Lookup(f.Name) != nil || binaryOnly[f.Name] != "" {
			return
		}
		if svc.Lookup(f.Name) == nil {
			t.Errorf("--%s is registered by the binary, not by clusterimport.Config.RegisterFlags: fleetd does not get it", f.Name)
		}
	})
	for name := range binaryOnly {
		if bin.Lookup(name) == nil {
			t.Errorf("binaryOnly lists --%s, which the binary no longer has", name)
		}
	}
}
