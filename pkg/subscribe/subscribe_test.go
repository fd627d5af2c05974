package subscribe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/events"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/subscribe"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// A real NATS server that confines the subscriber exactly as fleetd and the auth callout do.
func start(t testing.TB) (url string, js jetstream.JetStream) {
	t.Helper()
	auth := &natsauth.Authenticator{FullAccessTokens: []string{"producer"}, Log: testkit.Logger(t),
		Resolve: func(_ context.Context, _, token string) (natsauth.Identity, bool) {
			if token != "audit-token" {
				return natsauth.Identity{}, false
			}
			return natsauth.Identity{Kind: natsauth.KindSubscriber, Name: "audit", Streams: []string{subjects.RBACStream}}, true
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
	js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(context.Background(), topology.EventStream(subjects.RBACStream, "test", subjects.RBACPrefix+".>")); err != nil {
		t.Fatal(err)
	}
	return ns.ClientURL(), js
}

func bound(project, user string) *rbacv1.ProjectRoleBound {
	return &rbacv1.ProjectRoleBound{Binding: &rbacv1.ProjectRoleBinding{Project: project, RoleTemplate: "project-viewer",
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: user}}}
}

func TestSubscriberGetsTypedEventsInOrderAtLeastOnce(t *testing.T) {
	url, js := start(t)
	ctx := testkit.Context(t, 60*time.Second)
	store := events.NewStore(js, "system:test")
	subject := "fleet.rbac.binding.team-a"
	// Before the subscriber exists: it starts from sequence 1 and must see these too.
	for i := range 3 {
		if _, err := store.Append(ctx, subject, "team-a", events.Any, bound("team-a", fmt.Sprintf("u%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Append(ctx, "fleet.rbac.template.x", "x", events.Any, &rbacv1.RoleTemplateDeleted{Name: "x"}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	failedOnce := false
	done := make(chan struct{})
	h := func(_ context.Context, ev *events.Event) error {
		b, ok := ev.Payload.(*rbacv1.ProjectRoleBound)
		if !ok {
			t.Errorf("a filtered-out type was handed over: %s", ev.Type)
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if b.Binding.Subject.Name == "u1" && !failedOnce {
			failedOnce = true
			return errors.New("downstream database is down")
		}
		got = append(got, b.Binding.Subject.Name)
		if len(got) == 5 {
			close(done)
		}
		return nil
	}
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		errc <- subscribe.Run(runCtx, subscribe.Config{URL: url, Name: "audit", Token: "audit-token",
			Streams: []string{subjects.RBACStream}, Types: []string{"fleetstream.rbac.v1.ProjectRoleBound"}, FromSequence: 1}, h, testkit.Logger(t))
	}()
	for i := 3; i < 5; i++ {
		if _, err := store.Append(ctx, subject, "team-a", events.Any, bound("team-a", fmt.Sprintf("u%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case err := <-errc:
		t.Fatalf("subscriber stopped: %v", err)
	case <-ctx.Done():
		t.Fatalf("got %v", got)
	}
	stop()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// A failed event is redelivered before anything after it: order holds.
	if want := []string{"u0", "u1", "u2", "u3", "u4"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// Resuming continues after the last acknowledged event, not from the start.
	if _, err := store.Append(ctx, subject, "team-a", events.Any, bound("team-a", "u5")); err != nil {
		t.Fatal(err)
	}
	var again []string
	resumed := make(chan struct{})
	var once sync.Once
	ctx2, stop2 := context.WithCancel(ctx)
	defer stop2()
	go func() {
		_ = subscribe.Run(ctx2, subscribe.Config{URL: url, Name: "audit", Token: "audit-token", Streams: []string{subjects.RBACStream}, FromSequence: 1},
			func(_ context.Context, ev *events.Event) error {
				if b, ok := ev.Payload.(*rbacv1.ProjectRoleBound); ok {
					again = append(again, b.Binding.Subject.Name)
					once.Do(func() { close(resumed) })
				}
				return nil
			}, testkit.Logger(t))
	}()
	select {
	case <-resumed:
	case <-ctx.Done():
		t.Fatal("the resumed subscriber got nothing")
	}
	if !slices.Equal(again, []string{"u5"}) {
		t.Fatalf("resumed with %v, want [u5]", again)
	}
}

func TestWrongCredentialsOrStreamsAreRefused(t *testing.T) {
	url, _ := start(t)
	ctx := testkit.Context(t, 30*time.Second)
	nop := func(context.Context, *events.Event) error { return nil }
	if err := subscribe.Run(ctx, subscribe.Config{URL: url, Name: "audit", Token: "wrong", Streams: []string{subjects.RBACStream}}, nop, testkit.Logger(t)); err == nil {
		t.Fatal("a wrong token was admitted")
	}
	if err := subscribe.Run(ctx, subscribe.Config{URL: url, Name: "audit", Token: "audit-token", Streams: []string{subjects.NamespaceStream}}, nop, testkit.Logger(t)); err == nil {
		t.Fatal("a stream not granted was read")
	}
}
