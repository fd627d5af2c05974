package fleetd_test

import (
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// A start that fails after the services were constructed (here the xDS port is taken) stops
// what it started: the data directory is free again and the same configuration starts once the
// port is.
func TestFailedStartStopsWhatItStarted(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fleetd.Config{
		DataDir: filepath.Join(t.TempDir(), "data"), HostedAgents: true,
		Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true}, NATSListen: "127.0.0.1:0",
		XDSListen: taken.Addr().String(),
	}
	ctx := testkit.Context(t, 2*time.Minute)
	before := runtime.NumGoroutine()
	if _, err := fleetd.Start(ctx, cfg, testkit.Logger(t)); err == nil || !strings.Contains(err.Error(), "--xds-listen") {
		t.Fatalf("start with the xDS port taken: %v, want an --xds-listen error", err)
	}
	// Nothing of it keeps running: the failed start cancelled every service's loops and waited
	// for them.
	testkit.Eventually(t, 2*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > before+10 {
			return fmt.Errorf("%d goroutines after the failed start, %d before", n, before)
		}
		return nil
	})
	_ = taken.Close()
	inst, err := fleetd.Start(ctx, cfg, testkit.Logger(t))
	if err != nil {
		t.Fatalf("start again on the same data dir: %v", err)
	}
	defer inst.Stop()
	select {
	case <-inst.Ready():
	case <-ctx.Done():
		t.Fatal("not ready")
	}
}
