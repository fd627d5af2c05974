package clusterimport

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// Heartbeats handled out of order (several workers, several replicas) must never move a
// cluster's last-seen time backwards.
func TestOlderHeartbeatNeverOverwritesNewer(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	// Heartbeats 1 s apart, each past a third of UnreachableAfter: every one is written.
	s, err := New(ctx, j.JS, Config{PlaintextCredentials: true, UnreachableAfter: 2 * time.Second}, testkit.Logger(t)) // stores no credentials
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

// An idle fleet's heartbeats are written at most every third of UnreachableAfter per cluster;
// anything besides the time is written at once.
func TestHeartbeatsWithNothingNewAreWrittenOnlyAsOftenAsLivenessNeeds(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	s, err := New(ctx, j.JS, Config{PlaintextCredentials: true, UnreachableAfter: 30 * time.Second}, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.status.Run(ctx) }() // the cache recentEnough reads, as Run starts it
	<-s.status.Ready()
	base := time.Now()
	hb := func(after time.Duration, version string) *clusterv1.AgentStatus {
		return &clusterv1.AgentStatus{ClusterName: "c1", KubernetesVersion: version, SessionId: "s1",
			LastSeen: timestamppb.New(base.Add(after)), InClusterLastSeen: timestamppb.New(base.Add(after))}
	}
	for _, tc := range []struct {
		name    string
		st      *clusterv1.AgentStatus
		written bool
	}{
		{"first", hb(0, "v1.34.0"), true},
		{"5 s later, nothing new", hb(5*time.Second, "v1.34.0"), false},
		{"9 s later, nothing new", hb(9*time.Second, "v1.34.0"), false},
		{"10 s later: a third of UnreachableAfter", hb(10*time.Second, "v1.34.0"), true},
		{"15 s later, an upgrade", hb(15*time.Second, "v1.35.0"), true},
	} {
		before, _ := s.statusKV.Get(ctx, "c1")
		if !s.nothingNew("c1", "c1", tc.st, &agentv1.Heartbeat{}, nil) {
			if _, err := s.recordHeartbeat(ctx, "c1", tc.st); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		after, err := s.statusKV.Get(ctx, "c1")
		if err != nil {
			t.Fatal(err)
		}
		if written := before == nil || after.Revision() != before.Revision(); written != tc.written {
			t.Fatalf("%s: written = %v, want %v", tc.name, written, tc.written)
		}
		// The cache the next decision reads follows the bucket.
		testkit.Eventually(t, 5*time.Second, func() error {
			if cur, ok := s.status.Get("c1"); !ok || cur.LastSeen.AsTime().Before(base) {
				return errors.New("status cache behind the bucket")
			}
			if cur, _ := s.status.Get("c1"); tc.written && !cur.LastSeen.AsTime().Equal(tc.st.LastSeen.AsTime()) {
				return errors.New("status cache behind the bucket")
			}
			return nil
		})
	}
}
