package clusterimport

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// Heartbeats handled out of order (several workers, several replicas) must never move a
// cluster's last-seen time backwards.
func TestOlderHeartbeatNeverOverwritesNewer(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	s, err := New(ctx, j.JS, Config{PlaintextCredentials: true}, testkit.Logger(t)) // stores no credentials
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := base.Add(time.Duration(i%20) * time.Second) // interleaved, with repeats
			if _, err := s.recordHeartbeat(context.Background(), "c1", &clusterv1.AgentStatus{ClusterName: "c1", LastSeen: timestamppb.New(at)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// Whether a heartbeat is the newest decides whether its resources may count.
	for _, tc := range []struct {
		name   string
		at     time.Time
		newest bool
	}{
		{"older", base, false},
		{"the newest redelivered", base.Add(19 * time.Second), true},
	} {
		newest, err := s.recordHeartbeat(ctx, "c1", &clusterv1.AgentStatus{ClusterName: "c1", LastSeen: timestamppb.New(tc.at)})
		if err != nil || newest != tc.newest {
			t.Fatalf("%s: newest = %v, %v; want %v", tc.name, newest, err, tc.newest)
		}
	}
	e, err := s.statusKV.Get(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	st := &clusterv1.AgentStatus{}
	if err := proto.Unmarshal(e.Value(), st); err != nil {
		t.Fatal(err)
	}
	if want := base.Add(19 * time.Second); !st.LastSeen.AsTime().Equal(want) {
		t.Fatalf("last seen %v, want the newest %v", st.LastSeen.AsTime(), want)
	}
}
