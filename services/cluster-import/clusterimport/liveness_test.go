package clusterimport_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// lastClusterEvent returns the sequence and the payload of the last event on cluster's subject.
func lastClusterEvent(t *testing.T, ctx context.Context, js jetstream.JetStream, cluster string) (uint64, proto.Message) {
	t.Helper()
	stream, err := js.Stream(ctx, subjects.ClusterStream)
	if err != nil {
		t.Fatal(err)
	}
	seq, ev, err := events.Last(ctx, stream, subjects.Cluster(cluster))
	if err != nil {
		t.Fatal(err)
	}
	return seq, ev.Payload
}

// lastEventIs waits until the last event of cluster is of type T and returns it.
func lastEventIs[T proto.Message](t *testing.T, ctx context.Context, js jetstream.JetStream, cluster string, within time.Duration) T {
	t.Helper()
	var got T
	testkit.Eventually(t, within, func() error {
		_, p := lastClusterEvent(t, ctx, js, cluster)
		ev, ok := p.(T)
		if !ok {
			return fmt.Errorf("cluster %s: last event %T, want %T", cluster, p, got)
		}
		got = ev
		return nil
	})
	return got
}

// keepBeating sends cluster's agent heartbeats on core NATS every interval, the first after
// first, until the returned stop is called.
func keepBeating(t *testing.T, js jetstream.JetStream, cluster string, first, interval time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		wait := first
		for {
			select {
			case <-done:
				return
			case <-time.After(wait):
			}
			wait = interval
			data, err := proto.Marshal(&agentv1.Heartbeat{ClusterName: cluster, KubernetesVersion: "v1.34.4", Time: timestamppb.Now()})
			if err == nil {
				err = js.Conn().Publish(subjects.AgentLiveHeartbeat(cluster), data)
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// A restarted registry has heard no heartbeat for as long as it was down (they are not
// stored), so it gives every cluster UnreachableAfter from its own start before marking it
// lost: an agent that kept beating is never marked lost for the heartbeats nobody received,
// and one that went silent before the restart is marked lost once that grace has passed, with
// its true last-seen time.
func TestLivenessAfterARestartWaitsItsGraceBeforeMarkingLost(t *testing.T) {
	const unreachable = 2 * time.Second
	cfg := clusterimport.Config{UnreachableAfter: unreachable, CheckInterval: 100 * time.Millisecond}
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	e := start(t, j, cfg)
	for _, name := range []string{"beating", "silent"} {
		register(t, e, name, nil)
		liveHeartbeat(t, j.JS, name, "v1.34.4")
		lastEventIs[*clusterv1.ClusterAgentConnected](t, ctx, j.JS, name, 10*time.Second)
	}
	e.stop()
	stopped := time.Now()
	connectedAt, _ := lastClusterEvent(t, ctx, j.JS, "beating")

	// Down for longer than UnreachableAfter: every stored last-seen time is older than that.
	time.Sleep(unreachable + 500*time.Millisecond)
	restarted := time.Now()
	e = start(t, j, cfg)
	// The beating agent's next heartbeat reaches the new registry half its grace after it
	// started (an agent reconnecting, then its heartbeat interval), and more follow.
	stopBeating := keepBeating(t, j.JS, "beating", unreachable/2, unreachable/4)
	defer stopBeating()

	lost := lastEventIs[*clusterv1.ClusterAgentLost](t, ctx, j.JS, "silent", 10*time.Second)
	if at := lost.Time.AsTime(); at.Before(restarted.Add(unreachable)) {
		t.Errorf("silent cluster marked lost at %v, %v after the restart: within its grace of %v", at, at.Sub(restarted), unreachable)
	}
	if seen := lost.LastSeen.AsTime(); seen.After(stopped) {
		t.Errorf("silent cluster lost with last seen %v, after the registry stopped (%v): want its last heartbeat", seen, stopped)
	}
	// The silent cluster's grace has passed, and so has the one the beating cluster had before
	// its first heartbeat after the restart: it was never marked lost (which would have
	// appended ClusterAgentLost, and ClusterAgentConnected after it at its next heartbeat).
	if err := e.svc.SyncLiveness(ctx); err != nil {
		t.Fatal(err)
	}
	if seq, p := lastClusterEvent(t, ctx, j.JS, "beating"); seq != connectedAt {
		t.Fatalf("beating cluster: last event %T at %d, want still the ClusterAgentConnected at %d from before the restart", p, seq, connectedAt)
	}
}

// An append that fails (here: the cluster stream refuses every message) is tried again with
// the cluster's own backoff, not at the next full pass: once appends go through again the
// silent cluster is marked lost though nothing about it changed, long before the controller's
// resync (a minute).
func TestLivenessRetriesAFailedLostAppendWithBackoff(t *testing.T) {
	const unreachable, maxDelay = time.Second, 100 * time.Millisecond
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	e := start(t, j, clusterimport.Config{UnreachableAfter: unreachable, CheckInterval: maxDelay})
	register(t, e, "c1", nil)
	beat := time.Now()
	liveHeartbeat(t, j.JS, "c1", "v1.34.4")
	lastEventIs[*clusterv1.ClusterAgentConnected](t, ctx, j.JS, "c1", 10*time.Second)

	stream, err := j.JS.Stream(ctx, subjects.ClusterStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	good := info.Config
	broken := good
	broken.MaxMsgSize = 16 // smaller than any event
	if _, err := j.JS.UpdateStream(ctx, broken); err != nil {
		t.Fatal(err)
	}
	before, err := e.svc.LivenessRetries()
	if err != nil {
		t.Fatal(err)
	}
	var retries float64
	testkit.Eventually(t, 10*time.Second, func() error {
		n, err := e.svc.LivenessRetries()
		if retries = n - before; err == nil && retries < 8 {
			err = fmt.Errorf("%v retries", retries)
		}
		return err
	})
	// The failures began no sooner than UnreachableAfter after the last heartbeat. Backing off
	// from 10 ms up to CheckInterval, a check is retried at most about once per CheckInterval
	// after the first few; retried at once it would have been thousands of times.
	failing := time.Since(beat.Add(unreachable))
	if most := 5 + float64(failing)/float64(maxDelay); retries > most {
		t.Fatalf("%v retries in %v of failures; with backoff at most %v", retries, failing, most)
	}
	if _, p := lastClusterEvent(t, ctx, j.JS, "c1"); !isConnected(p) {
		t.Fatalf("last event %T while appends fail", p)
	}
	if _, err := j.JS.UpdateStream(ctx, good); err != nil {
		t.Fatal(err)
	}
	lastEventIs[*clusterv1.ClusterAgentLost](t, ctx, j.JS, "c1", 5*time.Second)
}

func isConnected(p proto.Message) bool {
	_, ok := p.(*clusterv1.ClusterAgentConnected)
	return ok
}

// One cluster whose ClusterAgentLost cannot be appended (its subject is full: the stream
// refuses a new message on a subject at MaxMsgsPerSubject) is retried with its own backoff,
// 10 ms doubling up to CheckInterval, and holds no other cluster back: a cluster that goes
// silent while the first keeps failing is marked lost at its own deadline (its last seen plus
// UnreachableAfter), not at the failing cluster's next retry or a pass over the fleet, and is
// never retried itself. Once the subject takes messages again, the failing cluster is marked
// lost too.
func TestLivenessFailingClusterBacksOffAlone(t *testing.T) {
	const unreachable, maxDelay = time.Second, 3 * time.Second
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	core, logs := observer.New(zapcore.WarnLevel)
	log := testkit.Logger(t).WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return zapcore.NewTee(c, core) }))
	e := startLogged(t, j, clusterimport.Config{UnreachableAfter: unreachable, CheckInterval: maxDelay}, log)
	// failures returns when each failed check of cluster was retried, in order.
	failures := func(cluster string) []time.Time {
		var at []time.Time
		for _, entry := range logs.FilterMessage("reconcile failed; retried").FilterField(zap.String("key", cluster)).All() {
			at = append(at, entry.Time)
		}
		return at
	}
	others := []string{"ok-1", "ok-2", "ok-3", "ok-4"}
	for _, name := range append([]string{"stuck"}, others...) {
		register(t, e, name, nil)
		liveHeartbeat(t, j.JS, name, "v1.34.4")
		lastEventIs[*clusterv1.ClusterAgentConnected](t, ctx, j.JS, name, 10*time.Second)
	}
	// stuck gets more events than any other subject, so a per-subject limit of its count
	// refuses its next append and no other's (and purges nothing).
	for i := range 3 {
		if _, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "stuck",
			Labels: map[string]string{"round": fmt.Sprint(i)}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := j.JS.Stream(ctx, subjects.ClusterStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	full := info.State.Subjects[subjects.Cluster("stuck")]
	for subject, n := range info.State.Subjects {
		if subject != subjects.Cluster("stuck") && n >= full {
			t.Fatalf("%s holds %d events, stuck %d: a limit of %d would refuse it too", subject, n, full, full)
		}
	}
	good := info.Config
	limited := good
	limited.Discard, limited.DiscardNewPerSubject, limited.MaxMsgsPerSubject = jetstream.DiscardNew, true, int64(full)
	if _, err := j.JS.UpdateStream(ctx, limited); err != nil {
		t.Fatal(err)
	}

	// The others keep beating until stuck has failed eight times (its next retry is then
	// 1.28 s away, the one after 2.56 s), then go silent one after another, so that their
	// deadlines fall at different moments of stuck's backoff.
	stops := make([]func(), len(others))
	for i, name := range others {
		stops[i] = keepBeating(t, j.JS, name, 0, 200*time.Millisecond)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		if n := len(failures("stuck")); n < 8 {
			return fmt.Errorf("stuck failed %d times", n)
		}
		return nil
	})
	for _, stop := range stops {
		stop()
		time.Sleep(400 * time.Millisecond)
	}

	for _, name := range others {
		lost := lastEventIs[*clusterv1.ClusterAgentLost](t, ctx, j.JS, name, 10*time.Second)
		due := lost.LastSeen.AsTime().Add(unreachable)
		if late := lost.Time.AsTime().Sub(due); late < 0 || late > 750*time.Millisecond {
			t.Errorf("%s marked lost %v after its deadline (last seen %v + %v): want at it, whatever stuck's backoff",
				name, late, lost.LastSeen.AsTime(), unreachable)
		}
		if f := failures(name); len(f) > 0 {
			t.Errorf("%s's check failed %d times: stuck's failures are stuck's alone", name, len(f))
		}
	}
	if _, p := lastClusterEvent(t, ctx, j.JS, "stuck"); isLost(p) {
		t.Fatal("stuck marked lost while its subject refuses appends")
	}
	// Each retry waits at least twice as long as the one before, up to maxDelay: retried at
	// once, stuck would have been tried thousands of times.
	at := failures("stuck")
	for i := 1; i < len(at); i++ {
		want := min(10*time.Millisecond<<(i-1), maxDelay)
		if gap := at[i].Sub(at[i-1]); gap < want*9/10 {
			t.Errorf("stuck's failure %d came %v after the one before: want at least %v", i+1, gap, want)
		}
	}

	if _, err := j.JS.UpdateStream(ctx, good); err != nil {
		t.Fatal(err)
	}
	lastEventIs[*clusterv1.ClusterAgentLost](t, ctx, j.JS, "stuck", maxDelay+5*time.Second)
}

func isLost(p proto.Message) bool {
	_, ok := p.(*clusterv1.ClusterAgentLost)
	return ok
}
