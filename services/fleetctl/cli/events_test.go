package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/events"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

func TestEventsTailPrintsWhatTheSubscriberMayRead(t *testing.T) {
	auth := &natsauth.Authenticator{FullAccessTokens: []string{"producer"}, Log: testkit.Logger(t),
		Resolve: func(_ context.Context, _, token string) (natsauth.Identity, bool) {
			return natsauth.Identity{Kind: natsauth.KindSubscriber, Name: "audit", Streams: []string{subjects.RBACStream}}, token == "audit-token"
		}}
	ns, err := natsembed.Start(natsembed.Config{Name: "t", StoreDir: t.TempDir(), Port: -1, Logger: testkit.Logger(t), Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Stop)
	nc, err := nats.Connect(ns.ClientURL(), nats.Token("producer"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := testkit.Context(t, 30*time.Second)
	if _, err := js.CreateStream(ctx, topology.EventStream(subjects.RBACStream, "test", subjects.RBACPrefix+".>")); err != nil {
		t.Fatal(err)
	}
	store := events.NewStore(js, "system:rbac-sync")
	for i := range 2 {
		b := &rbacv1.ProjectRoleBound{Binding: &rbacv1.ProjectRoleBinding{Project: "team-a", RoleTemplate: "project-viewer",
			Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: fmt.Sprintf("u%d", i)}}}
		if _, err := store.Append(ctx, "fleet.rbac.binding.team-a", "team-a", events.Any, b); err != nil {
			t.Fatal(err)
		}
	}
	tokenFile := filepath.Join(t.TempDir(), "audit.token")
	if err := os.WriteFile(tokenFile, []byte("audit-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// tail runs until interrupted: stop it once both events are printed.
	tctx, stop := context.WithTimeout(ctx, 5*time.Second)
	defer stop()
	e := &e2eEnv{}
	r := e.runWith(t, tctx, nil, "events", "tail", "--nats-url", ns.ClientURL(), "--subscriber", "audit",
		"--subscriber-token-file", tokenFile, "--stream", subjects.RBACStream, "--from-seq", "1", "-o", "json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if strings.Count(r.stdout, "fleetstream.rbac.v1.ProjectRoleBound") < 2 || !strings.Contains(r.stdout, `"u1"`) || !strings.Contains(r.stdout, "system:rbac-sync") {
		t.Fatalf("output:\n%s", r.stdout)
	}
	r = e.runWith(t, ctx, nil, "events", "tail", "--nats-url", ns.ClientURL(), "--subscriber", "audit",
		"--subscriber-token-file", tokenFile, "--stream", subjects.NamespaceStream)
	if r.code == 0 {
		t.Fatal("a stream the subscriber was not given was read")
	}
}
