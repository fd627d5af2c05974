package natsauth_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// A kick closes every connection of one identity's instance and nothing else: not the agent of
// a cluster registered again under the same name (another instance), not another cluster's.
func TestServerKickerClosesOnlyThatInstance(t *testing.T) {
	ids := map[string]natsauth.Identity{
		"old-c1": {Kind: natsauth.KindAgent, Name: "c1", Instance: "id-1"},
		"new-c1": {Kind: natsauth.KindAgent, Name: "c1", Instance: "id-2"},
		"c2":     {Kind: natsauth.KindAgent, Name: "c2", Instance: "id-3"},
	}
	ns, err := natsembed.Start(natsembed.Config{Port: -1, StoreDir: t.TempDir(), Auth: &natsauth.Authenticator{
		Resolve: func(_ context.Context, _, token string) (natsauth.Identity, bool) {
			id, ok := ids[token]
			return id, ok
		}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	dial := func(token string) *nats.Conn {
		nc, err := nats.Connect(ns.ClientURL(), nats.Token(token), nats.NoReconnect())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	old := []*nats.Conn{dial("old-c1"), dial("old-c1")}
	keep := []*nats.Conn{dial("new-c1"), dial("c2")}
	n, err := natsauth.ServerKicker{Server: ns.Server}.Kick(testkit.Context(t, 10*time.Second), ids["old-c1"].User())
	if err != nil || n != 2 {
		t.Fatalf("kick %s: %d closed, %v; want 2", ids["old-c1"].User(), n, err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		for _, nc := range old {
			if !nc.IsClosed() {
				return context.DeadlineExceeded
			}
		}
		return nil
	})
	for _, nc := range keep {
		if !nc.IsConnected() {
			t.Errorf("a connection of another instance or cluster was closed: %v", nc.Status())
		}
	}
	if n, err := (natsauth.ServerKicker{Server: ns.Server}).Kick(context.Background(), ids["old-c1"].User()); err != nil || n != 0 {
		t.Errorf("second kick: %d closed, %v; want nothing left to close", n, err)
	}
}
