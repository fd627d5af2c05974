package events_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// On FLEET_AGENT (as the agents get it, also when the stream existed before it allowed TTLs) a
// message appended with ExpiresAfter leaves the stream once its TTL passes, and a report
// without one stays.
func TestExpiringAppendLeavesTheAgentStream(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	old := subjects.AgentStream()
	old.AllowMsgTTL = false
	if _, err := j.JS.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	s, err := j.JS.CreateOrUpdateStream(ctx, subjects.AgentStream())
	if err != nil {
		t.Fatalf("enable per-message TTLs on the existing stream: %v", err)
	}
	store := events.NewStore(j.JS, "system:cluster-agent:c1")
	gone := subjects.AgentEndpointSlice("c1", "shop", "cart-1")
	kept := subjects.AgentEndpointSlice("c1", "shop", "cart-2")
	if _, err := store.Append(ctx, gone, "c1", events.Any.ExpiresAfter(time.Second), &endpointv1.EndpointSliceReport{Namespace: "shop", Slice: "cart-1", Deleted: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, kept, "c1", events.Any, &endpointv1.EndpointSliceReport{Namespace: "shop", Slice: "cart-2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLastMsgForSubject(ctx, gone); err != nil {
		t.Fatalf("the tombstone is not stored: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := s.GetLastMsgForSubject(ctx, gone); !errors.Is(err, jetstream.ErrMsgNotFound) {
			return errors.New("the tombstone is still there")
		}
		return nil
	})
	if _, err := s.GetLastMsgForSubject(ctx, kept); err != nil {
		t.Fatalf("the report without a TTL is gone: %v", err)
	}
}

// A stream that does not allow per-message TTLs (FLEET_AGENT as a hub older than the agent
// created it) refuses an expiring append with an error IsTTLDisabled recognises, so the agent can
// fall back to a plain one; other refusals are not mistaken for it.
func TestIsTTLDisabled(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	old := subjects.AgentStream()
	old.AllowMsgTTL = false
	if _, err := j.JS.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	store := events.NewStore(j.JS, "system:cluster-agent:c1")
	subject := subjects.AgentEndpointSlice("c1", "shop", "cart-1")
	_, err := store.Append(ctx, subject, "c1", events.Any.ExpiresAfter(time.Hour), &endpointv1.EndpointSliceReport{Namespace: "shop", Slice: "cart-1", Deleted: true})
	if !events.IsTTLDisabled(err) {
		t.Fatalf("expiring append to a stream without TTLs: %v, want IsTTLDisabled", err)
	}
	if _, err := store.Append(ctx, subject, "c1", events.Any, &endpointv1.EndpointSliceReport{Namespace: "shop", Slice: "cart-1", Deleted: true}); err != nil {
		t.Fatalf("the same append without a TTL: %v", err)
	}
	_, err = store.Append(ctx, subject, "c1", events.Empty, &endpointv1.EndpointSliceReport{Namespace: "shop", Slice: "cart-1"})
	if err == nil || events.IsTTLDisabled(err) {
		t.Fatalf("a conflicting append: %v, want a refusal that is not IsTTLDisabled", err)
	}
}
