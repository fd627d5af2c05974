package desired_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
)

const (
	applied = desiredv1.Phase_PHASE_APPLIED
	failed  = desiredv1.Phase_PHASE_FAILED
)

// A namespace and its quota are created with our marks, the quota's live status comes back in
// the applied status, and hand-made drift is repaired.
func TestAppliesReportsAndRepairs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.start(t)

	ns := namespaceObj("team-a", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED)
	quota := quotaObj("team-a", "fleetstream-quota", "10")
	nsRev := e.put(t, ns)
	quotaRev := e.put(t, quota)

	testkit.Eventually(t, waitFor, e.managedNamespace(ns, "p1"))
	quotas := e.kube.Client.CoreV1().ResourceQuotas("team-a")
	quotaApplied := func() error {
		q, err := quotas.Get(e.ctx, quota.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := q.Spec.Hard.Pods(); got.String() != "10" {
			return fmt.Errorf("quota hard pods %s, want 10", got)
		}
		return checkMarks(q.ObjectMeta, quota, nil)
	}
	testkit.Eventually(t, waitFor, quotaApplied)
	e.waitStatus(t, ns, nsRev, applied, desired.ReasonApplied)
	e.waitStatus(t, quota, quotaRev, applied, desired.ReasonApplied)

	// No controller-manager computes usage here: write it as the quota controller would.
	q, err := quotas.Get(e.ctx, quota.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q.Status = corev1.ResourceQuotaStatus{
		Hard: q.Spec.Hard,
		Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("3"), corev1.ResourceRequestsCPU: resource.MustParse("500m")},
	}
	if _, err := quotas.UpdateStatus(e.ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, waitFor, func() error {
		st, err := e.status(quota)
		if err != nil || st == nil {
			return fmt.Errorf("status: %v %v", st, err)
		}
		var s corev1.ResourceQuotaStatus
		if err := json.Unmarshal(st.StatusJson, &s); err != nil {
			return fmt.Errorf("status_json %q: %w", st.StatusJson, err)
		}
		if used := s.Used[corev1.ResourcePods]; used.String() != "3" {
			return fmt.Errorf("status_json %s: used pods %s, want 3", st.StatusJson, used.String())
		}
		if hard := s.Hard[corev1.ResourcePods]; hard.String() != "10" {
			return fmt.Errorf("status_json %s: hard pods %s, want 10", st.StatusJson, hard.String())
		}
		return nil
	})

	drift := []struct {
		name    string
		breakIt func(t *testing.T)
		check   func() error
	}{
		{
			name: "quota edited by hand",
			breakIt: func(t *testing.T) {
				q, err := quotas.Get(e.ctx, quota.name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				q.Spec.Hard[corev1.ResourcePods] = resource.MustParse("99")
				if _, err := quotas.Update(e.ctx, q, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			check: quotaApplied,
		},
		{
			name: "managed-by label removed by hand",
			breakIt: func(t *testing.T) {
				patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, desired.ManagedByLabel)
				if _, err := e.kube.Client.CoreV1().Namespaces().Patch(e.ctx, ns.name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			check: e.managedNamespace(ns, "p1"),
		},
		{
			name: "quota deleted by hand",
			breakIt: func(t *testing.T) {
				if err := quotas.Delete(e.ctx, quota.name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			check: quotaApplied,
		},
		{
			name: "namespace deleted by hand",
			breakIt: func(t *testing.T) {
				old, err := e.kube.Client.CoreV1().Namespaces().Get(e.ctx, ns.name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := e.kube.Client.CoreV1().Namespaces().Delete(e.ctx, ns.name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				// While it terminates, the agent says why it is not applied.
				e.waitStatus(t, ns, nsRev, failed, desired.ReasonTerminating)
				e.finalize(t, ns.name)
				testkit.Eventually(t, waitFor, func() error {
					cur, err := e.kube.Client.CoreV1().Namespaces().Get(e.ctx, ns.name, metav1.GetOptions{})
					if err != nil {
						return err
					}
					if cur.UID == old.UID {
						return errors.New("namespace not recreated yet")
					}
					return nil
				})
			},
			check: e.managedNamespace(ns, "p1"),
		},
	}
	for _, tc := range drift {
		t.Run(tc.name, func(t *testing.T) {
			tc.breakIt(t)
			testkit.Eventually(t, waitFor, tc.check)
		})
	}
	e.waitStatus(t, ns, nsRev, applied, desired.ReasonApplied)

	// A changed desired object is applied and reported with its new revision.
	quota2 := quotaObj("team-a", "fleetstream-quota", "20")
	rev2 := e.put(t, quota2)
	e.waitStatus(t, quota2, rev2, applied, desired.ReasonApplied)
	q, err = quotas.Get(e.ctx, quota.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Spec.Hard.Pods(); got.String() != "20" {
		t.Errorf("quota hard pods %s after update, want 20", got)
	}
}

// An unlabelled namespace is adopted; one labelled for another project is left alone.
func TestOwnershipGuard(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.start(t)

	tests := []struct {
		name       string
		existing   map[string]string
		wantPhase  desiredv1.Phase
		wantReason string
		check      func(t *testing.T, d desiredObj, st *desiredv1.AppliedStatus) error
	}{
		{
			name:       "unlabelled namespace adopted",
			existing:   map[string]string{"keep": "me"},
			wantPhase:  applied,
			wantReason: desired.ReasonApplied,
			check: func(t *testing.T, d desiredObj, _ *desiredv1.AppliedStatus) error {
				ns, err := e.kube.Client.CoreV1().Namespaces().Get(e.ctx, d.name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if ns.Labels["keep"] != "me" {
					return fmt.Errorf("adoption dropped a foreign label: %v", ns.Labels)
				}
				return checkMarks(ns.ObjectMeta, d, map[string]string{projectLabel: "p1"})
			},
		},
		{
			name:       "namespace of another project untouched",
			existing:   map[string]string{projectLabel: "p2"},
			wantPhase:  failed,
			wantReason: desired.ReasonOwnedByOther,
			check: func(t *testing.T, d desiredObj, st *desiredv1.AppliedStatus) error {
				if !strings.Contains(st.Message, `"p2"`) {
					return fmt.Errorf("message %q does not name the owner p2", st.Message)
				}
				ns, err := e.kube.Client.CoreV1().Namespaces().Get(e.ctx, d.name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if ns.Labels[projectLabel] != "p2" || ns.Labels[desired.ManagedByLabel] != "" || len(ns.Annotations) != 0 {
					return fmt.Errorf("namespace of p2 was touched: labels %v annotations %v", ns.Labels, ns.Annotations)
				}
				return nil
			},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("owned-%d", i)
			e.createNamespace(t, name, tc.existing)
			d := namespaceObj(name, "p1", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED)
			rev := e.put(t, d)
			st := e.waitStatus(t, d, rev, tc.wantPhase, tc.wantReason)
			if err := tc.check(t, d, st); err != nil {
				t.Error(err)
			}
		})
	}
}

// Tombstones delete or release what they name; objects that are not ours stay.
func TestTombstones(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.start(t)

	tests := []struct {
		name       string
		obj        desiredObj
		policy     desiredv1.DeletionPolicy
		wantReason string
		check      func(t *testing.T, d desiredObj)
	}{
		{
			name:       "delete namespace",
			obj:        namespaceObj("doomed", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_DELETE),
			policy:     desiredv1.DeletionPolicy_DELETION_POLICY_DELETE,
			wantReason: desired.ReasonDeleting,
			check: func(t *testing.T, d desiredObj) {
				ns, err := e.kube.Client.CoreV1().Namespaces().Get(e.ctx, d.name, metav1.GetOptions{})
				if err == nil && ns.DeletionTimestamp == nil {
					t.Errorf("namespace %s not deleted", d.name)
				}
				// Once it is really gone, the status says so.
				e.finalize(t, d.name)
				st := e.waitStatus(t, d, 0, applied, desired.ReasonDeleted)
				if !st.Absent {
					t.Errorf("status %v not absent", st)
				}
			},
		},
		{
			name:       "orphan namespace",
			obj:        namespaceObj("kept", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_ORPHAN),
			policy:     desiredv1.DeletionPolicy_DELETION_POLICY_ORPHAN,
			wantReason: desired.ReasonReleased,
			check: func(t *testing.T, d desiredObj) {
				testkit.Eventually(t, waitFor, e.unmanagedNamespace(d.name))
			},
		},
		{
			name:       "delete cluster role (unspecified policy)",
			obj:        clusterRoleObj("fleet:viewer"),
			policy:     desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED,
			wantReason: desired.ReasonDeleted,
			check: func(t *testing.T, d desiredObj) {
				if _, err := e.kube.Client.RbacV1().ClusterRoles().Get(e.ctx, d.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("cluster role %s: %v, want not found", d.name, err)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rev := e.put(t, tc.obj)
			e.waitStatus(t, tc.obj, rev, applied, desired.ReasonApplied)
			ts := tombstone(tc.obj, tc.policy)
			rev = e.put(t, ts)
			e.waitStatus(t, ts, rev, applied, tc.wantReason)
			tc.check(t, ts)
		})
	}

	// A tombstone never deletes what the agent did not create or adopt.
	e.createNamespace(t, "foreign", nil)
	d := tombstone(namespaceObj("foreign", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_DELETE), desiredv1.DeletionPolicy_DELETION_POLICY_DELETE)
	rev := e.put(t, d)
	e.waitStatus(t, d, rev, applied, desired.ReasonNotManaged)
	if ns, err := e.kube.Client.CoreV1().Namespaces().Get(e.ctx, "foreign", metav1.GetOptions{}); err != nil || ns.DeletionTimestamp != nil {
		t.Errorf("foreign namespace touched: %v %v", ns, err)
	}
}

// An agent that was down while desired state changed converges when it returns: tombstones
// written, keys deleted (pruned; namespaces released, not deleted) and objects added meanwhile.
func TestConvergesAfterRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	stop := e.start(t)

	stay := namespaceObj("stay", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED)
	stayQuota := quotaObj("stay", "q-stay", "5")
	revoked := quotaObj("stay", "q-revoked", "7")
	dropped := namespaceObj("dropped", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED)
	role := clusterRoleObj("fleet:auditor")
	for _, d := range []desiredObj{stay, stayQuota, revoked, dropped, role} {
		rev := e.put(t, d)
		e.waitStatus(t, d, rev, applied, desired.ReasonApplied)
	}
	stop()

	// While the agent is away: a revocation, two keys gone, a newcomer, and drift.
	revokedTS := tombstone(revoked, desiredv1.DeletionPolicy_DELETION_POLICY_DELETE)
	revokedRev := e.put(t, revokedTS)
	e.del(t, dropped)
	e.del(t, role)
	newcomer := namespaceObj("newcomer", "p3", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED)
	newRev := e.put(t, newcomer)
	if err := e.kube.Client.CoreV1().ResourceQuotas("stay").Delete(e.ctx, stayQuota.name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	e.start(t)
	e.waitStatus(t, revokedTS, revokedRev, applied, desired.ReasonDeleted)
	e.waitStatus(t, newcomer, newRev, applied, desired.ReasonApplied)
	testkit.Eventually(t, waitFor, e.managedNamespace(newcomer, "p3"))
	testkit.Eventually(t, waitFor, e.managedNamespace(stay, "p1"))
	testkit.Eventually(t, waitFor, func() error {
		if _, err := e.kube.Client.CoreV1().ResourceQuotas("stay").Get(e.ctx, revoked.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("revoked quota: %v, want not found", err)
		}
		if _, err := e.kube.Client.CoreV1().ResourceQuotas("stay").Get(e.ctx, stayQuota.name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("quota deleted while the agent was down not recreated: %w", err)
		}
		if _, err := e.kube.Client.RbacV1().ClusterRoles().Get(e.ctx, role.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("cluster role whose key vanished: %v, want pruned", err)
		}
		return nil
	})
	// The namespace whose key vanished is released, not deleted.
	testkit.Eventually(t, waitFor, e.unmanagedNamespace(dropped.name))
	// Statuses of vanished keys go with them.
	testkit.Eventually(t, waitFor, func() error {
		for _, d := range []desiredObj{dropped, role} {
			if st, err := e.status(d); err != nil || st != nil {
				return fmt.Errorf("status of vanished %s: %v %v", d.key(), st, err)
			}
		}
		return nil
	})
}

// Buckets that do not exist yet are waited for, not fatal.
func TestWaitsForBuckets(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	var logs *testkit.Logs
	e.log, logs = testkit.ObservedLogger(t)
	e.start(t)
	// A few failed attempts to open each of them first.
	for _, b := range subjects.DesiredBuckets() {
		testkit.Eventually(t, waitFor, func() error {
			if n := logs.FilterMessage("desired bucket does not exist yet").FilterField(zap.String("bucket", b)).Len(); n < 2 {
				return fmt.Errorf("%d attempts to open bucket %s", n, b)
			}
			return nil
		})
	}
	e.createBuckets(t)
	d := namespaceObj("late", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED)
	rev := e.put(t, d)
	e.waitStatus(t, d, rev, applied, desired.ReasonApplied)
	testkit.Eventually(t, waitFor, e.managedNamespace(d, "p1"))
}
