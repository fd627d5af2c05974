package daemon_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/natsmetrics"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// A service's connection (ConnectAs, as every service binary connects) that its server drops
// counts one disconnect and, once it is back, one reconnect.
func TestConnectionCountsDisconnectsAndReconnects(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(natsmetrics.Collectors()...)
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	nc, _, err := daemon.ConnectAs(ctx, j.Server.ClientURL(), "", "", "test-service", testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	before := map[string]float64{}
	for _, m := range []string{"fleetstream_nats_disconnects_total", "fleetstream_nats_reconnects_total"} {
		before[m] = testkit.Counter(t, reg, m, "", "")
	}
	id, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Server.DisconnectClientByID(id); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		for m, b := range before {
			if got := testkit.Counter(t, reg, m, "", ""); got != b+1 {
				return fmt.Errorf("%s went from %g to %g, want one more", m, b, got)
			}
		}
		if !nc.IsConnected() {
			return fmt.Errorf("not connected again")
		}
		return nil
	})
}
