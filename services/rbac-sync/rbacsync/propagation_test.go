package rbacsync_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/slo"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// propagation returns the propagation histogram of kind as /metrics serves it (nil: none yet).
func propagation(t testing.TB, reg *server.Registry, kind string) *dto.Histogram {
	t.Helper()
	return testkit.Histogram(t, reg, "fleetstream_propagation_duration_seconds", "kind", kind)
}

// The propagation SLO as an operator alerts on it: a grant, and then its revocation, each
// observed once when the agent's applied status for the desired object arrives, with the time
// since the change (so in the bucket that holds it). A status about an older revision, and
// objects no agent reported on, observe nothing. A role template's changes (its creation, its
// rules' update) are of kind role_template, not grants.
func TestPropagationIsMeasuredAtTheAppliedStatus(t *testing.T) {
	e := start(t, nil, rbacsync.Config{})
	ctx := context.Background()
	applied, err := e.js.JS.KeyValue(ctx, subjects.AppliedBucket)
	if err != nil {
		t.Fatal(err)
	}
	report := func(key string, rev uint64, absent bool) {
		t.Helper()
		data, _ := proto.Marshal(&desiredv1.AppliedStatus{DesiredRevision: rev, Phase: desiredv1.Phase_PHASE_APPLIED, Absent: absent})
		if _, err := applied.Put(ctx, subjects.AppliedKey(subjects.DesiredRBACBucket, key), data); err != nil {
			t.Fatal(err)
		}
	}
	// observed waits for kind's count to reach want and checks that the one new observation
	// lies between least seconds and the time since start, and in the buckets that hold it.
	observed := func(kind string, want uint64, least float64, start time.Time) {
		t.Helper()
		var h *dto.Histogram
		testkit.Eventually(t, 10*time.Second, func() error {
			if h = propagation(t, e.metrics, kind); h == nil || h.GetSampleCount() < want {
				return fmt.Errorf("%s: %d observations, want %d", kind, h.GetSampleCount(), want)
			}
			return nil
		})
		if h.GetSampleCount() != want {
			t.Fatalf("%s: %d observations, want %d", kind, h.GetSampleCount(), want)
		}
		if want != 1 {
			return
		}
		if len(h.GetBucket()) != len(slo.PropagationBuckets) {
			t.Fatalf("%s: %d buckets, want %v", kind, len(h.GetBucket()), slo.PropagationBuckets)
		}
		testkit.CheckObservation(t, kind, h, least, testkit.WallSince(start).Seconds())
	}

	e.register(t, "c1")
	e.createProject(t, "p1")
	e.createTemplate(t, "dev", nil, rule("", "pods", "get"))
	e.bindNS(t, "p1", "c1", "web")
	rb := rbKey("c1", "web", "dev")

	const agentDelay = 300 * time.Millisecond
	// agentWait is an agent taking agentDelay to apply, as measured on the wall clock: the
	// histogram's spans start at NATS message times.
	agentWait := func() float64 {
		w := testkit.WallNow()
		time.Sleep(agentDelay)
		return testkit.WallSince(w).Seconds()
	}
	// A round's writes are timed from the earliest change it took; the setup's must be done.
	e.settle(t)
	t0 := testkit.WallNow()
	e.bindRole(t, "p1", user("alice"), "dev")
	e.waitState(t, rb, "subjects:alice")
	rev := e.get(t, rb).revision
	report(rb, rev-1, false) // about an older object: the grant is not applied yet
	delay := agentWait()
	if h := propagation(t, e.metrics, "grant"); h.GetSampleCount() != 0 {
		t.Fatalf("a status about revision %d observed the grant written at %d", rev-1, rev)
	}
	report(rb, rev, false)
	observed("grant", 1, delay, t0)

	e.settle(t)
	t1 := testkit.WallNow()
	e.unbindRole(t, "p1", user("alice"), "dev")
	e.waitState(t, rb, "tombstone")
	delay = agentWait()
	report(rb, e.get(t, rb).revision, true)
	observed("revoke", 1, delay, t1)

	// The ClusterRole of template dev was written too, but no agent reported on it.
	agentWait()
	if h := propagation(t, e.metrics, "grant"); h.GetSampleCount() != 1 {
		t.Fatalf("grant observations %d, want 1 (only the reported RoleBinding)", h.GetSampleCount())
	}

	// A role template's change is its own kind, role_template: the ClusterRole the template's
	// creation wrote (no agent has applied it yet), and then the one its rules' change rewrites.
	cr := crKey("c1", "dev")
	e.settle(t)
	report(cr, e.get(t, cr).revision, false)
	countOf := func(kind string, want uint64) *dto.Histogram {
		t.Helper()
		var h *dto.Histogram
		testkit.Eventually(t, 10*time.Second, func() error {
			if h = propagation(t, e.metrics, kind); h.GetSampleCount() != want {
				return fmt.Errorf("%s: %d observations, want %d", kind, h.GetSampleCount(), want)
			}
			return nil
		})
		return h
	}
	before := countOf("role_template", 1).GetSampleSum()
	t2 := testkit.WallNow()
	if _, err := e.rbac.UpdateRoleTemplate(ctx, connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{Template: &rbacv1.RoleTemplate{Name: "dev",
		Rules: []*rbacv1.PolicyRule{rule("", "pods", "get"), rule("", "services", "get")}}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rules"}}})); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, cr, "rules:pods,services")
	delay = agentWait()
	report(cr, e.get(t, cr).revision, false)
	took := countOf("role_template", 2).GetSampleSum() - before
	if most := testkit.WallSince(t2).Seconds(); took < delay || took > most {
		t.Fatalf("the template's change took %.3fs by the histogram, want within [%.3f, %.3f]", took, delay, most)
	}
	for kind, want := range map[string]uint64{"grant": 1, "revoke": 1} {
		if h := propagation(t, e.metrics, kind); h.GetSampleCount() != want {
			t.Fatalf("%s observations %d, want %d: the template's changes counted as %s", kind, h.GetSampleCount(), want, kind)
		}
	}
}
