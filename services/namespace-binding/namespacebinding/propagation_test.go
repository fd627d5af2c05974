package namespacebinding_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

// A bind, its quota and the unbind are each observed once, by kind, when the agent's applied
// status for the desired object arrives, with the time since the change; nothing is observed
// before the agent reports.
func TestPropagationOfBindingsIsMeasuredAtTheAppliedStatus(t *testing.T) {
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.createProject(t, "p1")
	nsKey := subjects.DesiredKey("c1", "Namespace", "", "web")
	quotaKey := subjects.DesiredKey("c1", "ResourceQuota", "web", namespacebinding.QuotaName)
	observed := func(kind string, least float64, start time.Time) {
		t.Helper()
		testkit.Eventually(t, 10*time.Second, func() error {
			if h := testkit.Histogram(t, e.metrics, "fleetstream_propagation_duration_seconds", "kind", kind); h.GetSampleCount() == 0 {
				return fmt.Errorf("no %s observed yet", kind)
			}
			return nil
		})
		testkit.CheckObservation(t, kind, testkit.Histogram(t, e.metrics, "fleetstream_propagation_duration_seconds", "kind", kind),
			least, testkit.WallSince(start).Seconds())
	}
	const agentDelay = 300 * time.Millisecond
	// agentWait is an agent taking agentDelay to apply, as measured on the wall clock: the
	// histogram's spans start at NATS message times.
	agentWait := func() float64 {
		w := testkit.WallNow()
		time.Sleep(agentDelay)
		return testkit.WallSince(w).Seconds()
	}

	t0 := testkit.WallNow()
	e.mustBind(t, "p1", "c1", "web", map[string]string{"pods": "10"})
	e.desiredObject(t, nsKey, anyObject)
	e.desiredObject(t, quotaKey, anyObject)
	delay := agentWait()
	if h := testkit.Histogram(t, e.metrics, "fleetstream_propagation_duration_seconds", "kind", "bind"); h.GetSampleCount() != 0 {
		t.Fatal("a bind observed before its agent reported")
	}
	e.agentReports(t, nsKey, nil)
	observed("bind", delay, t0)
	e.agentReports(t, quotaKey, nil)
	observed("quota", delay, t0)

	t1 := testkit.WallNow()
	e.unbindNS(t, "p1", "c1", "web")
	e.desiredObject(t, nsKey, func(o *desiredv1.DesiredObject) bool { return o.Tombstone })
	delay = agentWait()
	e.agentReports(t, nsKey, nil)
	observed("unbind", delay, t1)
}

// The oldest unapplied change per cluster: a bind whose objects no agent has applied shows on
// its cluster with an age that grows at each scrape, another cluster with nothing pending has no
// series, and once the agent has applied both objects the cluster's series is gone.
func TestOldestUnappliedChangeIsAgedPerCluster(t *testing.T) {
	const gauge = "fleetstream_propagation_oldest_unapplied_seconds"
	e := start(t, nil, namespacebinding.Config{})
	e.register(t, "c1")
	e.register(t, "c2")
	e.createProject(t, "p1")
	nsKey := subjects.DesiredKey("c1", "Namespace", "", "web")
	quotaKey := subjects.DesiredKey("c1", "ResourceQuota", "web", namespacebinding.QuotaName)

	t0 := testkit.WallNow()
	e.mustBind(t, "p1", "c1", "web", map[string]string{"pods": "10"})
	e.desiredObject(t, nsKey, anyObject)
	e.desiredObject(t, quotaKey, anyObject)
	var first float64
	testkit.Eventually(t, 10*time.Second, func() error {
		v, ok := testkit.Gauge(t, e.metrics, gauge, "cluster", "c1")
		if !ok {
			return fmt.Errorf("no %s{cluster=c1} yet", gauge)
		}
		first = v
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	second, _ := testkit.Gauge(t, e.metrics, gauge, "cluster", "c1")
	if most := testkit.WallSince(t0).Seconds(); second < first+0.3 || second > most {
		t.Fatalf("c1's oldest unapplied change aged from %.3fs to %.3fs in 300ms, want +0.3s and at most %.3fs since the bind", first, second, most)
	}
	if v, ok := testkit.Gauge(t, e.metrics, gauge, "cluster", "c2"); ok {
		t.Fatalf("c2, with nothing bound, reports an unapplied change %.3fs old", v)
	}

	// The Namespace applied, the quota not: still pending.
	e.agentReports(t, nsKey, nil)
	testkit.Eventually(t, 10*time.Second, func() error {
		if h := testkit.Histogram(t, e.metrics, "fleetstream_propagation_duration_seconds", "kind", "bind"); h.GetSampleCount() == 0 {
			return errors.New("the Namespace's applied status not taken yet")
		}
		return nil
	})
	if _, ok := testkit.Gauge(t, e.metrics, gauge, "cluster", "c1"); !ok {
		t.Fatal("c1's quota is not applied, yet c1 has no oldest unapplied change")
	}
	e.agentReports(t, quotaKey, nil)
	testkit.Eventually(t, 10*time.Second, func() error {
		if v, ok := testkit.Gauge(t, e.metrics, gauge, "cluster", "c1"); ok {
			return fmt.Errorf("c1 still has an unapplied change %.3fs old", v)
		}
		return nil
	})
}

// A namespace put on a cluster, and later on another, because its placement decided so is a
// change of kind placement, not a bind: the move is timed from the fleet change that moved the
// decision to the agent's applied status on the new cluster.
func TestPropagationOfAPlacementMoveIsItsOwnKind(t *testing.T) {
	const name = "fleetstream_propagation_duration_seconds"
	e := placementFleet(t)
	e.mustCreatePlacement(t, &placementv1.Placement{Project: "team-a", Name: "one-eu", NumberOfClusters: ptr[int32](1),
		Predicates: []*placementv1.Predicate{predicate("region", "eu")}})
	e.eventuallyDecided(t, "team-a", "one-eu", "c1")
	if _, err := e.bindToPlacement("team-a", "web", "one-eu", nil); err != nil {
		t.Fatal(err)
	}
	count := func(kind string, want uint64) *dto.Histogram {
		t.Helper()
		var h *dto.Histogram
		testkit.Eventually(t, 10*time.Second, func() error {
			if h = testkit.Histogram(t, e.metrics, name, "kind", kind); h.GetSampleCount() != want {
				return fmt.Errorf("%s: %d observations, want %d", kind, h.GetSampleCount(), want)
			}
			return nil
		})
		return h
	}
	onC1 := subjects.DesiredKey("c1", "Namespace", "", "web")
	e.desiredObject(t, onC1, anyObject)
	e.agentReports(t, onC1, nil)
	before := count("placement", 1).GetSampleSum()

	// c1 leaves eu: the decision moves web to c2.
	t1 := testkit.WallNow()
	e.labelCluster(t, "c1", "region", "us")
	e.eventuallyDecided(t, "team-a", "one-eu", "c2")
	onC2 := subjects.DesiredKey("c2", "Namespace", "", "web")
	e.desiredObject(t, onC2, anyObject)
	w := testkit.WallNow()
	time.Sleep(300 * time.Millisecond)
	delay := testkit.WallSince(w).Seconds()
	e.agentReports(t, onC2, nil)
	took := count("placement", 2).GetSampleSum() - before
	if most := testkit.WallSince(t1).Seconds(); took < delay || took > most {
		t.Fatalf("the move took %.3fs by the histogram, want within [%.3f, %.3f]", took, delay, most)
	}
	if h := testkit.Histogram(t, e.metrics, name, "kind", "bind"); h.GetSampleCount() != 0 {
		t.Fatalf("a placement's namespace counted as %d binds", h.GetSampleCount())
	}
}
