package main

import (
	"flag"
	"testing"

	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// TestFlagsOfEveryService: fleetd takes every flag each service's binary registers through the
// service's RegisterFlags, with the same name, default and usage. Each binary's test
// (TestBinaryFlagsReachFleetd) checks its flags are those plus the daemon's and a listed few,
// so a flag added to a service and not to fleetd fails one of the two. Two services' flags of
// one name would panic here (flag redefined).
func TestFlagsOfEveryService(t *testing.T) {
	var cfg fleetd.Config
	var logLevel string
	fd := newFlagSet(&cfg, &logLevel)
	services := []struct {
		name     string
		register func(*flag.FlagSet)
	}{
		{"cluster-import", new(clusterimport.Config).RegisterFlags},
		{"endpoint-collector", new(collector.Config).RegisterFlags},
		{"namespace-binding", new(namespacebinding.Config).RegisterFlags},
		{"rbac-sync", new(rbacsync.Config).Snapshots.RegisterFlags},
	}
	for _, s := range services {
		t.Run(s.name, func(t *testing.T) {
			fs := flag.NewFlagSet(s.name, flag.ContinueOnError)
			s.register(fs)
			n := 0
			fs.VisitAll(func(want *flag.Flag) {
				n++
				got := fd.Lookup(want.Name)
				switch {
				case got == nil:
					t.Errorf("fleetd has no --%s", want.Name)
				case got.DefValue != want.DefValue || got.Usage != want.Usage:
					t.Errorf("fleetd's --%s = %q (%s), %s's = %q (%s)", want.Name, got.DefValue, got.Usage, s.name, want.DefValue, want.Usage)
				}
			})
			if n == 0 {
				t.Errorf("%s registers no flags", s.name)
			}
		})
	}
	// The flags the issue found missing.
	for _, name := range []string{"claim-grace", "policy-claim-grace", "stale-after", "evict-after", "weight-cleanup-after",
		"view-flush-interval", "no-view-writes", "workers", "response-cache-bytes"} {
		if fd.Lookup(name) == nil {
			t.Errorf("fleetd has no --%s", name)
		}
	}
}
