package events_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/natsmetrics"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// An append nobody answers (no stream takes the subject: a stream without a leader answers
// the same way) is published again four times, each counted, and then fails; an append that
// is stored at once counts nothing.
func TestAppendCountsItsPublishRetries(t *testing.T) {
	const retries = "fleetstream_nats_publish_retries_total"
	reg := prometheus.NewRegistry()
	reg.MustRegister(natsmetrics.Collectors()...)
	j, _ := setup(t)
	ctx := testkit.Context(t, 30*time.Second)
	store := events.NewStore(j.JS, "test")

	before := testkit.Counter(t, reg, retries, "", "")
	if _, err := store.Append(ctx, "test.c1", "c1", events.Any, &clusterv1.ClusterUpdated{Id: "c1"}); err != nil {
		t.Fatal(err)
	}
	if got := testkit.Counter(t, reg, retries, "", ""); got != before {
		t.Fatalf("a stored append counted %g retries", got-before)
	}
	_, err := store.Append(ctx, "nostream.c1", "c1", events.Any, &clusterv1.ClusterUpdated{Id: "c1"})
	if !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("append to a subject no stream takes: %v, want no response from a stream", err)
	}
	if got := testkit.Counter(t, reg, retries, "", ""); got != before+4 {
		t.Fatalf("%s went from %g to %g, want 4 retries more", retries, before, got)
	}
}
