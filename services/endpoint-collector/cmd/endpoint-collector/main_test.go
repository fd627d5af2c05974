package main

import (
	"flag"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck/flagchecktest"
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
	var o options
	var d daemon.Options
	flagchecktest.SharedFlags(t, func(fs *flag.FlagSet) { new(daemon.Options).Register(fs); o.RegisterFlags(fs) },
		[]func(*flag.FlagSet){d.Register, new(collector.Config).RegisterFlags}, binaryOnly)
}
