package main

import (
	"flag"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// TestBinaryFlagsReachFleetd: every flag of the binary is the daemon's, collector.Config's
// (which fleetd registers too: services/fleetd/cmd/fleetd's TestFlagsOfEveryService) or
// listed below with why fleetd has no use for it. A flag registered here and nowhere else
// fails: fleetd would not get it.
func TestBinaryFlagsReachFleetd(t *testing.T) {
	binaryOnly := map[string]string{
		"xds-listen": "fleetd registers it with xds.RegisterListenFlag too, serving xDS by default",
	}
	bin := flag.NewFlagSet("endpoint-collector", flag.ContinueOnError)
	var d daemon.Options
	d.Register(bin)
	var o options
	o.RegisterFlags(bin)

	daemonFlags := flag.NewFlagSet("daemon", flag.ContinueOnError)
	var d2 daemon.Options
	d2.Register(daemonFlags)
	svc := flag.NewFlagSet("collector", flag.ContinueOnError)
	var cfg collector.Config
	cfg.RegisterFlags(svc)

	bin.VisitAll(func(f *flag.Flag) {
		if daemonFlags.Lookup(f.Name) != nil || binaryOnly[f.Name] != "" {
			return
		}
		if svc.Lookup(f.Name) == nil {
			t.Errorf("--%s is registered by the binary, not by collector.Config.RegisterFlags: fleetd does not get it", f.Name)
		}
	})
	for name := range binaryOnly {
		if bin.Lookup(name) == nil {
			t.Errorf("binaryOnly lists --%s, which the binary no longer has", name)
		}
	}
}
