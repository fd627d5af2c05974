package testkit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/server"
)

// Authorize runs an authorizer over js's views with cfg on srv, as the service binaries and
// fleetd do, for the life of the test, and waits until it is ready.
func Authorize(t testing.TB, js jetstream.JetStream, srv *server.Server, cfg authz.Config) *authz.Authorizer {
	t.Helper()
	az := authz.New(js, cfg, Logger(t))
	srv.Authorize(az.Interceptor())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := az.Run(ctx); err != nil {
			t.Errorf("authorizer stopped: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-az.Ready():
	case <-time.After(20 * time.Second):
		t.Fatal("authorizer not ready")
	}
	return az
}
