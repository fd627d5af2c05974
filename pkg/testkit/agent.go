package testkit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// AgentReporter appends reports to FLEET_AGENT as the cluster agent of one cluster does (its
// identity, any expected sequence), for tests of the services that consume them; the tests
// decide what the reports say.
type AgentReporter struct {
	t       testing.TB
	store   *events.Store
	nc      *nats.Conn
	cluster string
}

// NewAgentReporter returns the reporter of cluster's agent.
func NewAgentReporter(t testing.TB, js jetstream.JetStream, cluster string) *AgentReporter {
	return &AgentReporter{t: t, store: events.NewStore(js, "system:cluster-agent:"+cluster), nc: js.Conn(), cluster: cluster}
}

// Publish appends m on subject, failing the test if it cannot.
func (r *AgentReporter) Publish(subject string, m proto.Message) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.store.Append(ctx, subject, r.cluster, events.Any, m); err != nil {
		r.t.Fatalf("publish %s: %v", subject, err)
	}
}

// Heartbeats publishes a heartbeat of the agent session session() returns at once and then every
// d, as a live agent does, until stop is called (at the latest when the test ends).
func (r *AgentReporter) Heartbeats(d time.Duration, session func() string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			// On core NATS, as agents send them (subjects.LivePrefix); a publish fails only on a
			// closed connection.
			data, err := proto.Marshal(&agentv1.Heartbeat{ClusterName: r.cluster, SessionId: session(), Time: timestamppb.Now()})
			if err == nil {
				err = r.nc.Publish(subjects.AgentLiveHeartbeat(r.cluster), data)
			}
			if err != nil && !errors.Is(err, nats.ErrConnectionClosed) && ctx.Err() == nil {
				r.t.Errorf("heartbeat: %v", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	r.t.Cleanup(stop)
	return stop
}
