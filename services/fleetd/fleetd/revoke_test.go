package fleetd_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// revocationBound is how soon a revoked identity's open connection must be closed.
const revocationBound = time.Second

// watchedConn is a client connection whose disconnection and closing the test waits for. It
// reconnects like a real client: a kicked connection tries again at once and must be refused.
type watchedConn struct {
	nc           *nats.Conn
	disconnected chan time.Time
	closed       chan struct{}
}

func dialWatched(t *testing.T, url, token, inbox string) *watchedConn {
	t.Helper()
	w := &watchedConn{disconnected: make(chan time.Time, 16), closed: make(chan struct{})}
	nc, err := nats.Connect(url, nats.Token(token), nats.CustomInboxPrefix(inbox),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.DisconnectErrHandler(func(*nats.Conn, error) {
			select {
			case w.disconnected <- time.Now():
			default:
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(w.closed) }))
	if err != nil {
		t.Fatalf("connect with %s's token: %v", inbox, err)
	}
	t.Cleanup(nc.Close)
	w.nc = nc
	return w
}

// cutWithin fails unless the connection was disconnected within bound of since, and is then
// refused on reconnecting (nats.go gives up, closing it, after the server refuses it twice).
func (w *watchedConn) cutWithin(t *testing.T, since time.Time, bound time.Duration) {
	t.Helper()
	select {
	case at := <-w.disconnected:
		t.Logf("connection cut %v after the revocation", at.Sub(since).Round(time.Millisecond))
		if at.Sub(since) > bound {
			t.Errorf("connection cut %v after the revocation, want within %v", at.Sub(since), bound)
		}
	case <-time.After(bound + 5*time.Second):
		t.Fatalf("revoked connection still open %v after the revocation (status %v)", bound+5*time.Second, w.nc.Status())
	}
	select {
	case <-w.closed:
		if !errors.Is(w.nc.LastError(), nats.ErrAuthorization) {
			t.Errorf("closed with %v, want refused reconnects (authorization violation)", w.nc.LastError())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("revoked client was let in again: status %v", w.nc.Status())
	}
}

// The attack: an agent connected before its cluster is deregistered keeps its connection, goes on
// publishing as that cluster, and, the name registered again, reads the new cluster's desired
// state. Deregistration must cut it within a second on the (only) server, and its token must
// admit nothing afterwards, least of all the new cluster of its name.
func TestDeregistrationClosesTheAgentsOpenConnection(t *testing.T) {
	inst, clusters := startFleetd(t)
	ctx := testkit.Context(t, 90*time.Second)
	reg, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	// c2's agent stays: the kick is for c1's agent only.
	reg2, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c2"}))
	if err != nil {
		t.Fatal(err)
	}
	old := dialWatched(t, inst.NATS.ClientURL(), reg.Msg.AgentToken, natsauth.AgentInboxPrefix("c1"))
	other := dialWatched(t, inst.NATS.ClientURL(), reg2.Msg.AgentToken, natsauth.AgentInboxPrefix("c2"))
	js, err := jetstream.New(old.nc)
	if err != nil {
		t.Fatal(err)
	}
	// The agent watches c1's desired RBAC, as agents do.
	kv, err := js.KeyValue(ctx, subjects.DesiredRBACBucket)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := kv.Watch(ctx, "c1.>", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Stop() }()
	// Its heartbeats arrive, as fleetd sees them.
	seen := make(chan string, 16)
	sub, err := inst.Conn.Subscribe(subjects.AgentHeartbeat("c1"), func(m *nats.Msg) { seen <- string(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := inst.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := old.nc.Publish(subjects.AgentHeartbeat("c1"), []byte("before")); err != nil {
		t.Fatal(err)
	}
	_ = old.nc.Flush()
	select {
	case <-seen:
	case <-time.After(5 * time.Second):
		t.Fatal("the agent's heartbeat did not arrive before the deregistration")
	}

	start := time.Now()
	if _, err := clusters.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	old.cutWithin(t, start, revocationBound)
	if err := old.nc.Publish(subjects.AgentHeartbeat("c1"), []byte("after")); err == nil {
		_ = old.nc.Flush()
		select {
		case m := <-seen:
			t.Fatalf("a deregistered cluster's agent still publishes as it: %q", m)
		case <-time.After(time.Second):
		}
	}

	// What the watch received while c1 was still the old agent's (rbac-sync's fan-out of the
	// built-in ClusterRoles after the first registration, the deletes of the deregistration) may
	// still sit in its channel: the connection is closed now, so nothing arriving later can be
	// newer. Drain it until it has been quiet for a while.
	for drained := false; !drained; {
		select {
		case _, ok := <-watch.Updates():
			drained = !ok
		case <-time.After(300 * time.Millisecond):
			drained = true
		}
	}

	// c1 again, a new cluster: the old connection and token reach none of its desired state.
	if _, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(inst.NATS.ClientURL(), nats.Token(reg.Msg.AgentToken), nats.CustomInboxPrefix(natsauth.AgentInboxPrefix("c1"))); err == nil {
		nc.Close()
		t.Fatal("the old cluster's token admits an agent of the new c1")
	}
	hubKV, err := inst.JS.KeyValue(ctx, subjects.DesiredRBACBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hubKV.Put(ctx, "c1.ClusterRole.=.new-cluster-secret", []byte("desired state of the new c1")); err != nil {
		t.Fatal(err)
	}
	select {
	case e, ok := <-watch.Updates():
		if ok && e != nil {
			t.Fatalf("the old agent read the new c1's desired %s", e.Key())
		}
	case <-time.After(time.Second):
	}
	if !other.nc.IsConnected() {
		t.Errorf("c2's agent lost its connection (status %v): only c1's may be cut", other.nc.Status())
	}
}

// A subscriber's consumer connection is cut when the subscriber is deleted.
func TestDeletedSubscribersOpenConnectionIsClosed(t *testing.T) {
	inst, _ := startFleetd(t)
	ctx := testkit.Context(t, 60*time.Second)
	subs := clusterv1connect.NewSubscriberServiceClient(http.DefaultClient, "http://"+inst.Addr, connect.WithInterceptors(bearer(apiToken)))
	res, err := subs.CreateSubscriber(ctx, connect.NewRequest(&clusterv1.CreateSubscriberRequest{Name: "audit", Streams: []string{subjects.ClusterStream}}))
	if err != nil {
		t.Fatal(err)
	}
	sub := res.Msg.Subscriber
	c := dialWatched(t, inst.NATS.ClientURL(), res.Msg.Token, sub.InboxPrefix)
	js, err := jetstream.New(c.nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, subjects.ClusterStream, jetstream.ConsumerConfig{
		Durable: sub.Consumers[subjects.ClusterStream], AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: subjects.ClusterPrefix + ".>"})
	if err != nil {
		t.Fatal(err)
	}
	consumed := make(chan struct{}, 64)
	cc, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack(); consumed <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	select {
	case <-consumed: // its own SubscriberCreated
	case <-time.After(5 * time.Second):
		t.Fatal("the subscriber consumes nothing before its deletion")
	}
	start := time.Now()
	if _, err := subs.DeleteSubscriber(ctx, connect.NewRequest(&clusterv1.DeleteSubscriberRequest{Name: "audit"})); err != nil {
		t.Fatal(err)
	}
	c.cutWithin(t, start, revocationBound)
}
