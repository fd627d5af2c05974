package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/services/kube-bridge/kubebridge"
)

// TestBinaryFlagsReachFleetd: every flag of the binary is the daemon's or kubebridge.Config's,
// which fleetd registers too (services/fleetd/cmd/fleetd's TestFlagsOfEveryService).
func TestBinaryFlagsReachFleetd(t *testing.T) {
	bin := flag.NewFlagSet("kube-bridge", flag.ContinueOnError)
	var d daemon.Options
	d.Register(bin)
	var cfg kubebridge.Config
	cfg.RegisterFlags(bin)
	daemonFlags := flag.NewFlagSet("daemon", flag.ContinueOnError)
	var d2 daemon.Options
	d2.Register(daemonFlags)
	bin.VisitAll(func(f *flag.Flag) {
		if daemonFlags.Lookup(f.Name) == nil && !strings.HasPrefix(f.Name, "kube-bridge-") {
			t.Errorf("--%s: the bridge's flags are named kube-bridge-*, as fleetd takes them", f.Name)
		}
	})
}
