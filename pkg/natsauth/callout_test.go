package natsauth_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.uber.org/zap/zaptest"

	"github.com/fleetstream/fleetstream/pkg/kvfeed"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

const calloutUser, calloutPassword = "callout", "callout-password"

// calloutServer is a real nats-server with JetStream whose only static user is the callout's
// responder: every other client is admitted (or not) by a Responder.
type calloutServer struct {
	*server.Server
	opts *server.Options
}

func startCalloutServer(t *testing.T, issuer, xkey nkeys.KeyPair, port int, dir string) *calloutServer {
	t.Helper()
	pub, err := issuer.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{
		ServerName: "callout-test", Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoSigs: true,
		AuthTimeout: 2,
		Users:       []*server.User{{Username: calloutUser, Password: calloutPassword}},
		AuthCallout: &server.AuthCallout{Issuer: pub, AuthUsers: []string{calloutUser}},
	}
	if xkey != nil {
		if opts.AuthCallout.XKey, err = xkey.PublicKey(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	cs := &calloutServer{Server: s, opts: opts}
	t.Cleanup(s.Shutdown)
	return cs
}

// tokens is the test's resolver: a fixed table of tokens.
type tokens struct {
	mu sync.Mutex
	m  map[string]natsauth.Identity
}

func (tk *tokens) resolve(_ context.Context, _, token string) (natsauth.Identity, bool) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	id, ok := tk.m[token]
	return id, ok
}

func (tk *tokens) revoke(token string) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	delete(tk.m, token)
}

// client is a connection whose asynchronous errors (the server's permission violations) the
// test can wait for.
type client struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

func connect(t *testing.T, url, token, inbox string) (*client, error) {
	t.Helper()
	c := &client{errs: make(chan error, 64)}
	opts := []nats.Option{nats.Token(token), nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.errs <- err:
			default:
			}
		})}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, err
	}
	t.Cleanup(nc.Close)
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return c, nil
}

// denied runs op, which must fail, and waits for the server to report a permission violation
// naming subject: a failure for any other reason (a missing key, a timeout) is not a denial.
func (c *client) denied(t *testing.T, subject string, op func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := op(ctx); err == nil {
		t.Fatalf("operation on %s succeeded, want permission denied", subject)
	}
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
				if strings.Contains(err.Error(), subject) {
					return
				}
			}
		case <-time.After(3 * time.Second):
			t.Fatalf("no permission violation reported for %s", subject)
		}
	}
}

func allowed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v (want allowed)", what, err)
	}
}

type fixture struct {
	srv    *calloutServer
	url    string
	admin  jetstream.JetStream
	tokens *tokens
	issuer nkeys.KeyPair
	cancel context.CancelFunc
	done   chan error
}

// startFixture starts the server, the responder (on its own auth user's connection) and the
// state the tests read: desired keys of c1 and c2, credentials, an event stream.
func startFixture(t *testing.T, withXKey bool) *fixture {
	t.Helper()
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	var xkey nkeys.KeyPair
	if withXKey {
		if xkey, err = nkeys.CreateCurveKeys(); err != nil {
			t.Fatal(err)
		}
	}
	f := &fixture{issuer: issuer, tokens: &tokens{m: map[string]natsauth.Identity{
		"agent-c1":      {Kind: natsauth.KindAgent, Name: "c1"},
		"svc-ns":        {Kind: natsauth.KindService, Name: natsauth.ServiceNamespaceBinding},
		"svc-bridge":    {Kind: natsauth.KindService, Name: natsauth.ServiceKubeBridge},
		"svc-unknown":   {Kind: natsauth.KindService, Name: "not-a-service"},
		"subscriber-a1": {Kind: natsauth.KindSubscriber, Name: "audit", Streams: []string{subjects.ClusterStream}},
	}}}
	f.srv = startCalloutServer(t, issuer, xkey, -1, t.TempDir())
	f.url = f.srv.ClientURL()
	rc, err := nats.Connect(f.url, nats.UserInfo(calloutUser, calloutPassword), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	if f.admin, err = jetstream.New(rc); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	f.done = make(chan error, 1)
	r := &natsauth.Responder{Issuer: issuer, XKey: xkey, Resolve: f.tokens.resolve, Log: zaptest.NewLogger(t)}
	go func() { f.done <- r.Run(ctx, rc) }()
	t.Cleanup(func() {
		cancel()
		<-f.done
	})
	f.seed(t)
	return f
}

func (f *fixture) seed(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, b := range []string{subjects.DesiredNamespacesBucket, subjects.DesiredRBACBucket, subjects.ClusterCredentialsBucket, subjects.AppliedBucket} {
		kv, err := f.admin.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"c1.Namespace.=.team-a", "c2.Namespace.=.team-b"} {
			if _, err := kv.Put(ctx, k, []byte("value of "+k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, s := range []jetstream.StreamConfig{
		{Name: subjects.ClusterStream, Subjects: []string{subjects.ClusterPrefix + ".>"}},
		{Name: subjects.NamespaceStream, Subjects: []string{subjects.NamespacePrefix + ".>"}},
	} {
		if _, err := f.admin.CreateStream(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	for _, subj := range []string{subjects.Cluster("c1"), subjects.NamespacePrefix + ".project.p1"} {
		if _, err := f.admin.Publish(ctx, subj, []byte("event")); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCalloutRefusesUnknownTokens(t *testing.T) {
	f := startFixture(t, false)
	for _, tc := range []struct{ name, token string }{
		{"wrong token", "not-a-token"},
		{"empty token", ""},
		{"service the table does not know", "svc-unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := connect(t, f.url, tc.token, "")
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Fatalf("connect with %s: %v, want an authorization violation", tc.name, err)
			}
		})
	}
	// The responder's own user with a wrong password does not reach the callout either.
	if nc, err := nats.Connect(f.url, nats.UserInfo(calloutUser, "wrong")); err == nil {
		nc.Close()
		t.Fatal("callout user with a wrong password connected")
	}
}

func TestCalloutConfinesAgentToItsCluster(t *testing.T) {
	for _, xkey := range []bool{false, true} {
		t.Run(fmt.Sprintf("xkey=%v", xkey), func(t *testing.T) {
			f := startFixture(t, xkey)
			c, err := connect(t, f.url, "agent-c1", natsauth.AgentInboxPrefix("c1"))
			allowed(t, "agent connect", err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			kv, err := c.js.KeyValue(ctx, subjects.DesiredNamespacesBucket)
			allowed(t, "open desired bucket", err)

			// Its own keys: the watch delivers c1's entry.
			w, err := kv.Watch(ctx, "c1.>")
			allowed(t, "watch own desired keys", err)
			got := ""
			for e := range w.Updates() {
				if e == nil {
					break
				}
				got = e.Key()
			}
			_ = w.Stop()
			if got != "c1.Namespace.=.team-a" {
				t.Fatalf("own watch delivered %q", got)
			}
			// Its own applied statuses may be written.
			applied, err := c.js.KeyValue(ctx, subjects.AppliedBucket)
			allowed(t, "open applied bucket", err)
			_, err = applied.Put(ctx, "desired-namespaces.c1.Namespace.=.team-a", []byte("ok"))
			allowed(t, "write own applied status", err)

			c.denied(t, "KV_desired-namespaces", func(ctx context.Context) error {
				w, err := kv.Watch(ctx, "c2.>")
				if err == nil {
					_ = w.Stop()
				}
				return err
			})
			c.denied(t, "$JS.API.DIRECT.GET.KV_desired-namespaces", func(ctx context.Context) error {
				_, err := kv.Get(ctx, "c2.Namespace.=.team-b")
				return err
			})
			c.denied(t, "$KV.applied.desired-namespaces.c2", func(ctx context.Context) error {
				_, err := applied.Put(ctx, "desired-namespaces.c2.Namespace.=.team-b", []byte("forged"))
				return err
			})
			c.denied(t, "fleet.>", func(context.Context) error {
				sub, err := c.nc.SubscribeSync("fleet.>")
				if err != nil {
					return err
				}
				if _, err := sub.NextMsg(500 * time.Millisecond); err == nil {
					return nil
				}
				return errors.New("no message")
			})
			c.denied(t, "KV_cluster-credentials", func(ctx context.Context) error {
				_, err := c.js.KeyValue(ctx, subjects.ClusterCredentialsBucket)
				return err
			})
			// Another agent's inbox (where c2's replies would go) is not its own.
			c.denied(t, "_INBOX_c2.>", func(context.Context) error {
				sub, err := c.nc.SubscribeSync("_INBOX_c2.>")
				if err != nil {
					return err
				}
				_, err = sub.NextMsg(500 * time.Millisecond)
				return err
			})
		})
	}
}

// An agent's replay of its import-watch key is a direct get naming the key (pkg/kvfeed): it
// reads its own key, and another cluster's is refused however it asks — by name, by wildcard,
// or with the batched form that carries its subjects in the request body.
func TestCalloutAgentDirectGetsOnlyItsOwnImportWatchKey(t *testing.T) {
	f := startFixture(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iw, err := f.admin.CreateKeyValue(ctx, subjects.FeedBucketConfig(subjects.ImportWatchBucket, ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"c1", "c2"} {
		if _, err := iw.Put(ctx, subjects.ImportWatchKey(c), []byte("spec of "+c)); err != nil {
			t.Fatal(err)
		}
	}
	c, err := connect(t, f.url, "agent-c1", natsauth.AgentInboxPrefix("c1"))
	allowed(t, "agent connect", err)
	get := func(ctx context.Context, subject string, body []byte) (*nats.Msg, error) {
		m, err := c.nc.RequestWithContext(ctx, subject, body)
		if err == nil && m.Header.Get("Status") != "" {
			return m, fmt.Errorf("status %s %s", m.Header.Get("Status"), m.Header.Get("Description"))
		}
		return m, err
	}
	prefix := "$JS.API.DIRECT.GET.KV_" + subjects.ImportWatchBucket
	own := prefix + ".$KV." + subjects.ImportWatchBucket + "." + subjects.ImportWatchKey("c1")
	m, err := get(ctx, own, nil)
	allowed(t, "direct get of its own import-watch key", err)
	if string(m.Data) != "spec of c1" {
		t.Fatalf("own key = %q", m.Data)
	}
	// The replay kvfeed makes, under the agent's permissions.
	w, err := kvfeed.Watch(ctx, c.js, subjects.ImportWatchBucket, subjects.ImportWatchKey("c1"), kvfeed.Options{})
	allowed(t, "watch its own import-watch key", err)
	var got []string
	for e := range w.Updates() {
		if e == nil {
			break
		}
		got = append(got, e.Key()+"="+string(e.Value()))
	}
	_ = w.Stop()
	if fmt.Sprint(got) != "[c1=spec of c1]" {
		t.Fatalf("own replay = %v (watch ended: %v)", got, w.Err())
	}

	for _, tc := range []struct {
		name, subject string
		body          []byte
	}{
		{"another cluster's key", prefix + ".$KV." + subjects.ImportWatchBucket + "." + subjects.ImportWatchKey("c2"), nil},
		{"a wildcard", prefix + ".$KV." + subjects.ImportWatchBucket + ".*", nil},
		{"multi_last in the body", prefix, []byte(`{"multi_last":["$KV.` + subjects.ImportWatchBucket + `.>"]}`)},
		{"last_by_subj in the body", prefix, []byte(`{"last_by_subj":"$KV.` + subjects.ImportWatchBucket + `.c2"}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.denied(t, tc.subject, func(ctx context.Context) error {
				m, err := get(ctx, tc.subject, tc.body)
				if err == nil {
					t.Errorf("%s answered %q", tc.subject, m.Data)
				}
				return err
			})
		})
	}
	c.denied(t, "fleet.feed.import-watch.c2", func(ctx context.Context) error {
		w, err := kvfeed.Watch(ctx, c.js, subjects.ImportWatchBucket, subjects.ImportWatchKey("c2"), kvfeed.Options{})
		if err != nil {
			return err
		}
		defer func() { _ = w.Stop() }()
		for e := range w.Updates() {
			if e != nil {
				t.Errorf("c2's replay delivered %s", e.Key())
			}
		}
		if w.Err() != nil {
			return w.Err()
		}
		return ctx.Err() // its replay was never answered
	})
}

func TestCalloutConfinesServiceToItsTable(t *testing.T) {
	f := startFixture(t, false)
	c, err := connect(t, f.url, "svc-ns", natsauth.ServiceInboxPrefix(natsauth.ServiceNamespaceBinding))
	allowed(t, "service connect", err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	own, err := c.js.KeyValue(ctx, subjects.DesiredNamespacesBucket)
	allowed(t, "open own bucket", err)
	_, err = own.Put(ctx, "c1.Namespace.=.team-c", []byte("x"))
	allowed(t, "write own bucket", err)
	_, err = own.Get(ctx, "c2.Namespace.=.team-b")
	allowed(t, "read own bucket", err)

	c.denied(t, "KV_desired-rbac", func(ctx context.Context) error {
		_, err := c.js.KeyValue(ctx, subjects.DesiredRBACBucket)
		return err
	})
	c.denied(t, "$KV.desired-rbac.", func(ctx context.Context) error {
		_, err := c.js.Publish(ctx, "$KV.desired-rbac.c1.ClusterRole.=.admin", []byte("forged"))
		return err
	})
	c.denied(t, "KV_cluster-credentials", func(ctx context.Context) error {
		_, err := c.js.KeyValue(ctx, subjects.ClusterCredentialsBucket)
		return err
	})
	c.denied(t, "fleet.cluster.", func(ctx context.Context) error {
		_, err := c.js.Publish(ctx, subjects.Cluster("forged"), []byte("event"))
		return err
	})
	// Not another service's replies.
	c.denied(t, "_INBOX_svc_cluster-import", func(context.Context) error {
		sub, err := c.nc.SubscribeSync(natsauth.ServiceInboxPrefix(natsauth.ServiceClusterImport) + ".>")
		if err != nil {
			return err
		}
		_, err = sub.NextMsg(500 * time.Millisecond)
		return err
	})
}

// The kube bridge mirrors the registry and the placement decisions and can change neither: what
// a hub API server tells it (it writes there) has no way back into Fleetstream.
func TestCalloutKubeBridgeOnlyReads(t *testing.T) {
	f := startFixture(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, b := range []string{subjects.ClustersBucket, subjects.PlacementDecisionsBucket} {
		kv, err := f.admin.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "c1", []byte("value")); err != nil {
			t.Fatal(err)
		}
	}
	c, err := connect(t, f.url, "svc-bridge", natsauth.ServiceInboxPrefix(natsauth.ServiceKubeBridge))
	allowed(t, "kube-bridge connect", err)
	for _, b := range []string{subjects.ClustersBucket, subjects.PlacementDecisionsBucket} {
		kv, err := c.js.KeyValue(ctx, b)
		allowed(t, "open "+b, err)
		w, err := kv.WatchAll(ctx)
		allowed(t, "watch "+b, err)
		select {
		case e := <-w.Updates():
			if e == nil || e.Key() != "c1" {
				t.Fatalf("watch %s: %v", b, e)
			}
		case <-ctx.Done():
			t.Fatalf("watch %s: nothing", b)
		}
		_ = w.Stop()
		c.denied(t, "$KV."+b+".", func(ctx context.Context) error {
			_, err := kv.Put(ctx, "c1", []byte("forged"))
			return err
		})
		c.denied(t, "$JS.API.STREAM.PURGE.KV_"+b, func(ctx context.Context) error {
			st, err := c.js.Stream(ctx, "KV_"+b)
			if err != nil {
				return err
			}
			return st.Purge(ctx)
		})
		c.denied(t, "$JS.API.STREAM.DELETE.KV_"+b, func(ctx context.Context) error {
			return c.js.DeleteKeyValue(ctx, b)
		})
	}
	c.denied(t, "fleet.cluster.", func(ctx context.Context) error {
		_, err := c.js.Publish(ctx, subjects.Cluster("c1"), []byte("forged event"))
		return err
	})
	c.denied(t, "KV_desired-rbac", func(ctx context.Context) error {
		_, err := c.js.KeyValue(ctx, subjects.DesiredRBACBucket)
		return err
	})
	c.denied(t, "KV_cluster-credentials", func(ctx context.Context) error {
		_, err := c.js.KeyValue(ctx, subjects.ClusterCredentialsBucket)
		return err
	})
	// It holds its hub's lease (and creates the bucket if missing), and no other service's.
	held := false
	err = lease.Run(ctx, c.js, natsauth.ServiceKubeBridge+".hub-uid", "bridge", time.Second, func(context.Context) error {
		held = true
		return nil
	})
	allowed(t, "hold lease kube-bridge.hub-uid", err)
	if !held {
		t.Fatal("the kube bridge never held its lease")
	}
	leases, err := c.js.KeyValue(ctx, lease.Bucket)
	allowed(t, "open the lease bucket", err)
	c.denied(t, "$KV."+lease.Bucket+".view", func(ctx context.Context) error {
		_, err := leases.Put(ctx, "view.clusters", []byte("forged"))
		return err
	})
}

func TestCalloutConfinesSubscriber(t *testing.T) {
	f := startFixture(t, false)
	c, err := connect(t, f.url, "subscriber-a1", natsauth.SubscriberInboxPrefix("audit"))
	allowed(t, "subscriber connect", err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := natsauth.SubscriberConsumer("audit", subjects.ClusterStream)
	cons, err := c.js.CreateOrUpdateConsumer(ctx, subjects.ClusterStream, jetstream.ConsumerConfig{
		Durable: name, FilterSubject: subjects.ClusterPrefix + ".>", AckPolicy: jetstream.AckExplicitPolicy})
	allowed(t, "create own durable consumer", err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	allowed(t, "fetch", err)
	n := 0
	for m := range batch.Messages() {
		n++
		allowed(t, "ack", m.DoubleAck(ctx))
	}
	if n != 1 {
		t.Fatalf("fetched %d events, want 1 (err %v)", n, batch.Error())
	}

	c.denied(t, "fleet.cluster.", func(ctx context.Context) error {
		_, err := c.js.Publish(ctx, subjects.Cluster("forged"), []byte("event"))
		return err
	})
	c.denied(t, "$JS.API.CONSUMER.CREATE.FLEET_CLUSTER.someone-else", func(ctx context.Context) error {
		_, err := c.js.CreateOrUpdateConsumer(ctx, subjects.ClusterStream, jetstream.ConsumerConfig{
			Durable: "someone-else", FilterSubject: subjects.ClusterPrefix + ".>", AckPolicy: jetstream.AckExplicitPolicy})
		return err
	})
	c.denied(t, "FLEET_NS", func(ctx context.Context) error {
		_, err := c.js.CreateOrUpdateConsumer(ctx, subjects.NamespaceStream, jetstream.ConsumerConfig{
			Durable: natsauth.SubscriberConsumer("audit", subjects.NamespaceStream), AckPolicy: jetstream.AckExplicitPolicy})
		return err
	})
	c.denied(t, "KV_desired-namespaces", func(ctx context.Context) error {
		_, err := c.js.KeyValue(ctx, subjects.DesiredNamespacesBucket)
		return err
	})
	c.denied(t, "$JS.API.DIRECT.GET.KV_desired-rbac", func(ctx context.Context) error {
		_, err := c.nc.Request("$JS.API.DIRECT.GET.KV_desired-rbac.$KV.desired-rbac.c1.Namespace.=.team-a", nil, time.Second)
		return err
	})
	c.denied(t, "$KV.desired-namespaces.", func(ctx context.Context) error {
		if err := c.nc.Publish("$KV.desired-namespaces.c1.Namespace.=.evil", []byte("x")); err != nil {
			return err
		}
		// A plain publish has no answer: the server's violation report is the verdict.
		return errors.New("published")
	})
	// Its durable consumer may be deleted by it.
	allowed(t, "delete own consumer", c.js.DeleteConsumer(ctx, subjects.ClusterStream, name))
}

// A revoked token admits no new connection, and the responder keeps answering after the
// server restarts under it.
func TestCalloutRevocationAndReconnect(t *testing.T) {
	f := startFixture(t, false)
	_, err := connect(t, f.url, "subscriber-a1", natsauth.SubscriberInboxPrefix("audit"))
	allowed(t, "connect before revocation", err)
	f.tokens.revoke("subscriber-a1")
	if _, err := connect(t, f.url, "subscriber-a1", natsauth.SubscriberInboxPrefix("audit")); err == nil {
		t.Fatal("revoked token connected")
	}

	// Restart the server on the same port and store: the responder's connection comes back and
	// answers again.
	opts, addr := f.srv.opts, f.srv.ClientURL()
	portNum := f.srv.Addr().(*net.TCPAddr).Port
	f.srv.Shutdown()
	f.srv.WaitForShutdown()
	opts.Port = portNum
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("restarted server not ready")
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		c, err := connect(t, addr, "agent-c1", natsauth.AgentInboxPrefix("c1"))
		if err != nil {
			return fmt.Errorf("agent cannot connect after the server restarted: %w", err)
		}
		c.nc.Close()
		return nil
	})
}

func TestLoadServiceTokens(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		wantErr       string
		lookup        map[string]string // token -> service ("" refused)
	}{
		{name: "valid", content: "# comment\n\ntok-ci,cluster-import\n tok-ns , namespace-binding\n",
			lookup: map[string]string{"tok-ci": "cluster-import", "tok-ns": "namespace-binding", "tok-x": "", "": ""}},
		{name: "unknown service", content: "s3cr3t,billing\n", wantErr: "unknown service"},
		{name: "no service", content: "s3cr3t\n", wantErr: "want token,service"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			st, err := natsauth.LoadServiceTokens(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "s3cr3t") {
					t.Fatalf("error echoes the token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for tok, want := range tc.lookup {
				got, ok := st.Lookup(tok)
				if got != want || ok != (want != "") {
					t.Errorf("Lookup(%q) = %q, %v; want %q", tok, got, ok, want)
				}
			}
		})
	}
}
