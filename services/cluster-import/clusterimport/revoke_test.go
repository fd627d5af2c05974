package clusterimport_test

import (
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// openConn is a client connection that reconnects like a real one, whose cut the test waits for.
type openConn struct {
	nc           *nats.Conn
	disconnected chan time.Time
	closed       chan struct{}
}

func dialOpen(t *testing.T, url, token, inbox string) *openConn {
	t.Helper()
	c := &openConn{disconnected: make(chan time.Time, 16), closed: make(chan struct{})}
	nc, err := nats.Connect(url, nats.Token(token), nats.CustomInboxPrefix(inbox),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.DisconnectErrHandler(func(*nats.Conn, error) {
			select {
			case c.disconnected <- time.Now():
			default:
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(c.closed) }))
	if err != nil {
		t.Fatalf("connect %s: %v", inbox, err)
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	return c
}

// cutWithin fails unless the connection was cut within bound of since and then refused on
// reconnecting (nats.go closes it after being refused twice).
func (c *openConn) cutWithin(t *testing.T, what string, since time.Time, bound time.Duration) {
	t.Helper()
	select {
	case at := <-c.disconnected:
		t.Logf("%s cut %v after the revocation", what, at.Sub(since).Round(time.Millisecond))
		if at.Sub(since) > bound {
			t.Errorf("%s cut %v after the revocation, want within %v", what, at.Sub(since), bound)
		}
	case <-time.After(bound + 5*time.Second):
		t.Fatalf("%s still open %v after the revocation (status %v)", what, bound+5*time.Second, c.nc.Status())
	}
	select {
	case <-c.closed:
		if !errors.Is(c.nc.LastError(), nats.ErrAuthorization) {
			t.Errorf("%s closed with %v, want refused reconnects (authorization violation)", what, c.nc.LastError())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s was let in again: status %v", what, c.nc.Status())
	}
}

// The attack on the compose stack's NATS: three routed servers behind the auth callout. A
// deregistered cluster's agent and a deleted subscriber, each connected to a server other than
// the one cluster-import (the callout's responder and the kicker) is connected to, keep their
// connections unless revocation reaches every server.
func TestRevocationClosesConnectionsOnEveryServer(t *testing.T) {
	e := startCalloutNodes(t, 3)
	ctx := testkit.Context(t, 120*time.Second)
	var tokens []string
	for _, name := range []string{"c1", "c2"} {
		reg, err := e.clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, reg.Msg.AgentToken)
	}
	res, err := e.subscribers.CreateSubscriber(ctx, connect.NewRequest(&clusterv1.CreateSubscriberRequest{Name: "audit", Streams: []string{subjects.ClusterStream}}))
	if err != nil {
		t.Fatal(err)
	}
	agent := dialOpen(t, e.urls[1], tokens[0], natsauth.AgentInboxPrefix("c1"))
	other := dialOpen(t, e.urls[1], tokens[1], natsauth.AgentInboxPrefix("c2"))
	subscriber := dialOpen(t, e.urls[2], res.Msg.Token, res.Msg.Subscriber.InboxPrefix)

	start := time.Now()
	if _, err := e.clusters.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	agent.cutWithin(t, "c1's agent on "+e.urls[1], start, time.Second)

	start = time.Now()
	if _, err := e.subscribers.DeleteSubscriber(ctx, connect.NewRequest(&clusterv1.DeleteSubscriberRequest{Name: "audit"})); err != nil {
		t.Fatal(err)
	}
	subscriber.cutWithin(t, "the subscriber on "+e.urls[2], start, time.Second)

	// c1 registered again is a new cluster: the old token admits nobody on any server.
	if _, err := e.clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	for _, url := range e.urls {
		if nc, err := natsConnect(url, tokens[0], natsauth.AgentInboxPrefix("c1")); err == nil {
			nc.Close()
			t.Errorf("the deregistered c1's token connected to %s after c1 was registered again", url)
		}
	}
	if !other.nc.IsConnected() {
		t.Errorf("c2's agent lost its connection (status %v): only c1's may be cut", other.nc.Status())
	}
}
