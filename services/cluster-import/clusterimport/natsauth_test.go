package clusterimport_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// calloutEnv is cluster-import as in the compose stack: a NATS cluster delegating every client
// but cluster-import's own user (and its system account user, which closes revoked
// connections) to the auth callout, answered by cluster-import.
type calloutEnv struct {
	url string
	// urls are the client URLs of every node; the responder and cluster-import use the first.
	urls        []string
	clusters    clusterv1connect.ClusterServiceClient
	subscribers clusterv1connect.SubscriberServiceClient
	admin       jetstream.JetStream
}

const serviceToken = "svc-token-of-rbac-sync"

// The system account user cluster-import kicks revoked connections with.
const kickerUser, kickerPassword = natsauth.SystemUser, "sys-pw"

func startCallout(t *testing.T) *calloutEnv { return startCalloutNodes(t, 1) }

// startCalloutNodes starts n routed nodes, configured like deploy/nats (auth.conf).
func startCalloutNodes(t *testing.T, n int) *calloutEnv {
	t.Helper()
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	issuerPub, _ := issuer.PublicKey()
	routePorts := make([]int, n)
	var routes []string
	for i := range routePorts {
		if routePorts[i], err = natsembed.FreePort(); err != nil {
			t.Fatal(err)
		}
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[i]))
	}
	var urls []string
	var nodes []*natsserver.Server
	for i := 0; i < n; i++ {
		sys := natsserver.NewAccount("SYS")
		opts := &natsserver.Options{
			ServerName: fmt.Sprintf("callout-%d", i), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true,
			AuthTimeout:   2,
			Accounts:      []*natsserver.Account{sys},
			SystemAccount: "SYS",
			Users: []*natsserver.User{{Username: "cluster-import", Password: "pw"},
				{Username: kickerUser, Password: kickerPassword, Account: sys, Permissions: natsauth.SystemPermissions().Server()}},
			AuthCallout: &natsserver.AuthCallout{Issuer: issuerPub, AuthUsers: []string{"cluster-import", kickerUser}},
		}
		if n > 1 {
			opts.Cluster = natsserver.ClusterOpts{Name: "callout", Host: "127.0.0.1", Port: routePorts[i]}
			opts.Routes = natsserver.RoutesFromStr(strings.Join(routes, ","))
		}
		ns, err := natsserver.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		t.Cleanup(ns.Shutdown)
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats not ready")
		}
		nodes = append(nodes, ns)
		urls = append(urls, ns.ClientURL())
	}
	if n > 1 {
		testkit.Eventually(t, 30*time.Second, func() error {
			for _, ns := range nodes {
				if ns.NumRoutes() < n-1 {
					return fmt.Errorf("%s has %d routes", ns.Name(), ns.NumRoutes())
				}
			}
			return nil
		})
	}
	nc, err := nats.Connect(urls[0], nats.UserInfo("cluster-import", "pw"),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.ServiceClusterImport)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if n > 1 {
		// JetStream answers once the nodes elected a meta leader.
		testkit.Eventually(t, 60*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := js.AccountInfo(ctx)
			return err
		})
	}
	sysnc, err := nats.Connect(urls[0], nats.UserInfo(kickerUser, kickerPassword), nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.SystemUser)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sysnc.Close)
	log := testkit.Logger(t)
	ctx, cancel := context.WithCancel(context.Background())
	svc, err := clusterimport.New(ctx, js, clusterimport.Config{PlaintextCredentials: true, Kicker: &natsauth.SystemKicker{Conn: sysnc}}, log)
	if err != nil {
		t.Fatal(err)
	}
	tokensFile := filepath.Join(t.TempDir(), "nats-service-tokens")
	if err := os.WriteFile(tokensFile, []byte(serviceToken+","+natsauth.ServiceRBACSync+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := natsauth.LoadServiceTokens(tokensFile)
	if err != nil {
		t.Fatal(err)
	}
	apiTokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(apiTokens, []byte(testToken+",admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{TokenFile: apiTokens}, log)
	if err != nil {
		t.Fatal(err)
	}
	// Who may call the SubscriberService (platform admins) is pkg/authz's table, tested there;
	// here every authenticated call passes.
	srv.Authorize(allowAll{})
	svc.Mount(srv)
	done := make(chan struct{}, 2)
	go func() { _ = svc.Run(ctx); done <- struct{}{} }()
	r := &natsauth.Responder{Issuer: issuer, Resolve: svc.NATSResolver(st), Log: log, ValidFor: time.Minute}
	go func() { _ = r.Run(ctx, nc); done <- struct{}{} }()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done; <-done })
	select {
	case <-svc.Ready():
	case <-time.After(20 * time.Second):
		t.Fatal("service not ready")
	}
	hc := testkit.BearerClient(hs.Client(), testToken)
	return &calloutEnv{url: urls[0], urls: urls, admin: js,
		clusters:    clusterv1connect.NewClusterServiceClient(hc, hs.URL),
		subscribers: clusterv1connect.NewSubscriberServiceClient(hc, hs.URL)}
}

func natsConnect(url, token, inbox string) (*nats.Conn, error) {
	return nats.Connect(url, nats.Token(token), nats.CustomInboxPrefix(inbox), nats.Timeout(3*time.Second))
}

func TestCalloutAdmitsRegisteredAgentsOnly(t *testing.T) {
	e := startCallout(t)
	ctx := testkit.Context(t, 60*time.Second)
	reg, err := e.clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	token := reg.Msg.AgentToken
	nc, err := natsConnect(e.url, token, natsauth.AgentInboxPrefix("c1"))
	if err != nil {
		t.Fatalf("registered agent refused: %v", err)
	}
	// It is an agent of c1: it may report heartbeats under its own prefix only.
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(ctx, subjects.AgentHeartbeat("c1"), []byte("{}")); err != nil {
		t.Fatalf("agent heartbeat: %v", err)
	}
	nc.Close()

	for _, tc := range []struct{ name, token, inbox string }{
		{"wrong token", "fsa_wrong", natsauth.AgentInboxPrefix("c1")},
		{"subscriber-looking wrong token", "fss_wrong", natsauth.SubscriberInboxPrefix("x")},
	} {
		if nc, err := natsConnect(e.url, tc.token, tc.inbox); err == nil {
			nc.Close()
			t.Errorf("%s connected", tc.name)
		}
	}
	// A service token from the file is that service.
	snc, err := natsConnect(e.url, serviceToken, natsauth.ServiceInboxPrefix(natsauth.ServiceRBACSync))
	if err != nil {
		t.Fatalf("service token refused: %v", err)
	}
	sjs, _ := jetstream.New(snc)
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if _, err := sjs.KeyValue(short, subjects.ClusterCredentialsBucket); err == nil {
		t.Error("rbac-sync opened the credentials bucket")
	}
	if _, err := sjs.KeyValue(ctx, subjects.ClustersBucket); err != nil {
		t.Errorf("rbac-sync cannot read the cluster registry: %v", err)
	}
	snc.Close()

	// Deregistered: its token admits nobody.
	if _, err := e.clusters.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	if nc, err := natsConnect(e.url, token, natsauth.AgentInboxPrefix("c1")); err == nil {
		nc.Close()
		t.Fatal("agent of a deregistered cluster connected")
	}
}

func TestSubscriberValidation(t *testing.T) {
	e := startCallout(t)
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := e.subscribers.CreateSubscriber(ctx, connect.NewRequest(&clusterv1.CreateSubscriberRequest{
		Name: "billing", Streams: []string{subjects.EndpointStream}})); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("X", 10000)
	for _, tc := range []struct {
		name    string
		req     *clusterv1.CreateSubscriberRequest
		code    connect.Code
		mention string
	}{
		{"bad name", &clusterv1.CreateSubscriberRequest{Name: "Not_A_Label", Streams: []string{subjects.ClusterStream}}, connect.CodeInvalidArgument, "name"},
		{"no streams", &clusterv1.CreateSubscriberRequest{Name: "a"}, connect.CodeInvalidArgument, "streams"},
		{"agent reports", &clusterv1.CreateSubscriberRequest{Name: "a", Streams: []string{subjects.AgentStreamName}}, connect.CodeInvalidArgument, "streams[0]"},
		{"a bucket", &clusterv1.CreateSubscriberRequest{Name: "a", Streams: []string{"KV_" + subjects.DesiredRBACBucket}}, connect.CodeInvalidArgument, "streams[0]"},
		{"credentials", &clusterv1.CreateSubscriberRequest{Name: "a", Streams: []string{subjects.ClusterStream, "KV_" + subjects.ClusterCredentialsBucket}}, connect.CodeInvalidArgument, "streams[1]"},
		{"twice", &clusterv1.CreateSubscriberRequest{Name: "a", Streams: []string{subjects.ClusterStream, subjects.ClusterStream}}, connect.CodeInvalidArgument, "streams[1]"},
		{"huge stream name", &clusterv1.CreateSubscriberRequest{Name: "a", Streams: []string{long}}, connect.CodeInvalidArgument, "streams[0]"},
		{"exists", &clusterv1.CreateSubscriberRequest{Name: "billing", Streams: []string{subjects.ClusterStream}}, connect.CodeAlreadyExists, "billing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.subscribers.CreateSubscriber(ctx, connect.NewRequest(tc.req))
			if connect.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("err %v, want %v mentioning %q", err, tc.code, tc.mention)
			}
			if len(err.Error()) > 1000 {
				t.Fatalf("error echoes the input: %d bytes", len(err.Error()))
			}
		})
	}
	if _, err := e.subscribers.DeleteSubscriber(ctx, connect.NewRequest(&clusterv1.DeleteSubscriberRequest{Name: "nobody"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("delete unknown: %v", err)
	}
}

func TestSubscriberLifecycle(t *testing.T) {
	e := startCallout(t)
	ctx := testkit.Context(t, 60*time.Second)
	if _, err := e.clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	res, err := e.subscribers.CreateSubscriber(ctx, connect.NewRequest(&clusterv1.CreateSubscriberRequest{
		Name: "audit", Streams: []string{subjects.ClusterStream}}))
	if err != nil {
		t.Fatal(err)
	}
	sub, token := res.Msg.Subscriber, res.Msg.Token
	consumerName := sub.Consumers[subjects.ClusterStream]
	if token == "" || consumerName != natsauth.SubscriberConsumer("audit", subjects.ClusterStream) || sub.InboxPrefix != natsauth.SubscriberInboxPrefix("audit") {
		t.Fatalf("created %v", sub)
	}
	list, err := e.subscribers.ListSubscribers(ctx, connect.NewRequest(&clusterv1.ListSubscribersRequest{}))
	if err != nil || len(list.Msg.Subscribers) != 1 || list.Msg.Subscribers[0].Name != "audit" {
		t.Fatalf("list: %v %v", list, err)
	}
	if strings.Contains(fmt.Sprint(list.Msg), token) {
		t.Fatal("list shows the token")
	}

	// The subscriber reads FLEET_CLUSTER through its durable consumer: the registration of c1,
	// and its own creation, which never carries the token.
	nc, err := natsConnect(e.url, token, sub.InboxPrefix)
	if err != nil {
		t.Fatalf("subscriber refused: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.CreateOrUpdateConsumer(ctx, subjects.ClusterStream, jetstream.ConsumerConfig{
		Durable: consumerName, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: subjects.ClusterPrefix + ".>"})
	if err != nil {
		t.Fatalf("create durable consumer: %v", err)
	}
	batch, err := cons.Fetch(10, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for m := range batch.Messages() {
		if strings.Contains(string(m.Data()), token) {
			t.Fatal("an event carries the subscriber's token")
		}
		ev, err := events.DecodeMsg(m)
		if err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, string(proto.MessageName(ev.Payload).Name()))
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(kinds, ",") != "ClusterRegistered,SubscriberCreated" {
		t.Fatalf("subscriber read %v", kinds)
	}
	// The registry still lists only real clusters: subscriber events are not clusters.
	clusters, err := e.clusters.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	if err != nil || len(clusters.Msg.Clusters) != 1 {
		t.Fatalf("clusters: %v %v", clusters, err)
	}

	if _, err := e.subscribers.DeleteSubscriber(ctx, connect.NewRequest(&clusterv1.DeleteSubscriberRequest{Name: "audit"})); err != nil {
		t.Fatal(err)
	}
	if nc2, err := natsConnect(e.url, token, sub.InboxPrefix); err == nil {
		nc2.Close()
		t.Fatal("deleted subscriber's token connected")
	} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("deleted subscriber: %v, want an authorization error", err)
	}
	list, err = e.subscribers.ListSubscribers(ctx, connect.NewRequest(&clusterv1.ListSubscribersRequest{}))
	if err != nil || len(list.Msg.Subscribers) != 0 {
		t.Fatalf("list after delete: %v %v", list, err)
	}
	// The name is free again, with a new token.
	again, err := e.subscribers.CreateSubscriber(ctx, connect.NewRequest(&clusterv1.CreateSubscriberRequest{
		Name: "audit", Streams: []string{subjects.NamespaceStream}}))
	if err != nil || again.Msg.Token == token {
		t.Fatalf("recreate: %v %v", again, err)
	}
}

type allowAll struct{}

func (allowAll) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }
func (allowAll) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}
func (allowAll) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
