package lease_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// A lease holder started while NATS cannot answer (a cluster still forming, here a server that
// is down) waits for it instead of failing: the first failed request used to end the service,
// and in fleetd every service with it.
func TestRunWaitsForTheLeaseBucket(t *testing.T) {
	j := testkit.StartJetStream(t)
	_, js := j.Connect(t)
	cfg := j.Server.Config()
	j.Server.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	held := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- lease.Run(ctx, js, "test.outage", "h", time.Second, func(ctx context.Context) error {
			close(held)
			<-ctx.Done()
			return nil
		}, lease.WithLogger(zaptest.NewLogger(t)))
	}()
	time.Sleep(2 * time.Second) // its first requests fail meanwhile
	select {
	case err := <-done:
		t.Fatalf("Run returned while NATS was down: %v", err)
	default:
	}
	s, err := natsembed.Start(cfg)
	if err != nil {
		t.Fatalf("restart nats: %v", err)
	}
	t.Cleanup(s.Stop)
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("Run returned instead of holding the lease: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the lease was not held within 60 s of NATS coming back")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
