package namespacebinding_test

import (
	"fmt"
	"testing"
	"time"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
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
