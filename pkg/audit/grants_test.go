package audit_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/audit"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1/auditv1connect"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// Under the auth callout's permission table, rbac-sync (which serves the trail in a distributed
// hub) can index every domain stream and answer queries, another service can record a denial,
// and no other service can forge an event row.
func TestGrantsOfTheServices(t *testing.T) {
	tokens := map[string]string{"rbac-token": natsauth.ServiceRBACSync, "ns-token": natsauth.ServiceNamespaceBinding}
	auth := &natsauth.Authenticator{FullAccessTokens: []string{"admin-token"}, Log: testkit.Logger(t),
		Resolve: func(_ context.Context, _, token string) (natsauth.Identity, bool) {
			svc, ok := tokens[token]
			return natsauth.Identity{Kind: natsauth.KindService, Name: svc}, ok
		}}
	ns, err := natsembed.Start(natsembed.Config{Name: "t", StoreDir: t.TempDir(), Port: -1, Logger: testkit.Logger(t), Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	connect := func(token, service string) jetstream.JetStream {
		opts := []nats.Option{nats.Token(token)}
		if service != "" {
			opts = append(opts, nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(service)))
		}
		nc, err := nats.Connect(ns.ClientURL(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		return js
	}
	admin := connect("admin-token", "")
	ctx := testkit.Context(t, 60*time.Second)
	var streams []jetstream.StreamConfig
	for _, s := range []struct{ name, prefix string }{{subjects.ClusterStream, subjects.ClusterPrefix}, {subjects.NamespaceStream, subjects.NamespacePrefix},
		{subjects.PlacementStream, subjects.PlacementPrefix}, {subjects.RBACStream, subjects.RBACPrefix}, {subjects.EndpointStream, subjects.EndpointPrefix}} {
		streams = append(streams, topology.EventStream(s.name, "test", s.prefix+".>"))
	}
	if err := topology.Ensure(ctx, admin, 1, topology.Topology{Streams: streams}); err != nil {
		t.Fatal(err)
	}
	store := events.NewStore(admin, "system:test")
	if _, err := store.Append(ctx, subjects.Cluster("c1"), "c1", events.Any, &clusterv1.ClusterRegistered{Id: "1", Name: "c1"}); err != nil {
		t.Fatal(err)
	}
	// One event on each other domain stream (the payload does not matter to the index).
	for _, subject := range []string{subjects.NamespacePrefix + ".project.team-a", subjects.ClusterSet("eu"),
		subjects.RBACPrefix + ".roletemplate.viewer", subjects.EndpointWeight("shop", "cart")} {
		if _, err := store.Append(ctx, subject, "x", events.Any, &projectv1.ProjectCreated{Name: "team-a"}); err != nil {
			t.Fatal(err)
		}
	}

	rbac := connect("rbac-token", natsauth.ServiceRBACSync)
	svc, err := audit.New(ctx, rbac, audit.Config{}, testkit.Logger(t))
	if err != nil {
		t.Fatalf("rbac-sync cannot set up the trail: %v", err)
	}
	srv, _ := testkit.TokenServer(t, rbac, []string{"token-admin,admin"}, authz.Config{PlatformAdmins: []string{"admin"}}, testkit.Logger(t))
	testkit.RunComponents(t, srv, svc)
	hs := testkit.Serve(t, srv)
	tr := &trail{js: rbac, svc: svc, client: auditv1connect.NewAuditServiceClient(testkit.BearerClient(http.DefaultClient, "token-admin"), hs.URL)}
	tr.waitRows(t, &auditv1.ListActivityRequest{Actor: "system:test"}, 5)

	// namespace-binding records a denial of its API.
	nsb := connect("ns-token", natsauth.ServiceNamespaceBinding)
	rec := audit.NewDenialRecorder(nsb, audit.DefaultDenialLimits, testkit.Logger(t))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = rec.Run(rctx) }()
	rec.RecordDenial("mallory", "/fleetstream.project.v1.ProjectService/BindNamespace", "namespacebindings", "team-a", "c1", "no")
	tr.waitRows(t, &auditv1.ListActivityRequest{DeniedOnly: true}, 1)

	// The attack: a service other than the indexer writes an event row in someone's name.
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	defer pcancel()
	_, err = nsb.Publish(pctx, subjects.AuditActivity(audit.ClassEvent, "team-a", "", "project", "team-a", "alice"), []byte{})
	if err == nil {
		t.Fatal("namespace-binding wrote an event row of the audit trail")
	}
	tr.waitRows(t, &auditv1.ListActivityRequest{Actor: "alice"}, 0)

	// The attack on the duplicate window: namespace-binding publishes a denied row under the
	// message id the indexer would have given the next FLEET_NS event ("<stream>:<seq>"), with a
	// body claiming to be that event, so that the real row is dropped and the forged one stands
	// in for it.
	forged, err := proto.Marshal(&auditv1.Activity{Time: timestamppb.Now(), Actor: "alice", Type: "fleetstream.project.v1.ProjectCreated",
		Kind: "project", Name: "team-b", Project: "team-b", Stream: subjects.NamespaceStream, Sequence: 2, EventId: "forged"})
	if err != nil {
		t.Fatal(err)
	}
	msg := &nats.Msg{Subject: subjects.AuditActivity(audit.ClassDenied, "team-a", "", "project", "team-b", "alice"), Data: forged, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, subjects.NamespaceStream+":2")
	if _, err := nsb.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("namespace-binding may record denials: %v", err)
	}
	aliceCtx := identity.WithActor(ctx, "alice")
	if _, err := store.Append(aliceCtx, subjects.NamespacePrefix+".project.team-b", "team-b", events.Any, &projectv1.ProjectCreated{Name: "team-b"}); err != nil {
		t.Fatal(err)
	}
	tr.waitRows(t, &auditv1.ListActivityRequest{Actor: "alice"}, 2)
	var real, denial int
	for _, a := range tr.all(t, &auditv1.ListActivityRequest{Actor: "alice"}) {
		switch {
		case a.Type == "Denied" && a.Stream == "" && a.Sequence == 0 && a.EventId == "" && a.Project == "team-a":
			denial++
		case a.Type != "Denied" && a.Stream == subjects.NamespaceStream && a.Sequence == 2 && a.EventId != "forged":
			real++
		default:
			t.Errorf("row %v is neither the real event nor a denial of team-a", a)
		}
	}
	if real != 1 || denial != 1 {
		t.Fatalf("%d real event rows and %d denials, want 1 and 1", real, denial)
	}
	// Nor can it read the secret the ids are keyed with.
	kctx, kcancel := context.WithTimeout(ctx, 2*time.Second)
	defer kcancel()
	if _, err := nsb.KeyValue(kctx, subjects.AuditCheckpointsBucket); err == nil {
		t.Fatal("namespace-binding can open the bucket of the audit index's message id key")
	}
}
