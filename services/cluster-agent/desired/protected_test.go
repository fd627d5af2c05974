package desired_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/protectedns"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
)

var (
	namespacesGVR   = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	roleBindingsGVR = schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}
)

// The attack, from a compromised hub: desired state (written straight into the buckets, past
// the API's refusal) binds kube-system and the agent's own namespace to a project and gives its
// owner a RoleBinding there. The agent adopts, labels, quotas and binds none of it, and reports
// each key Failed. What an agent without the protection applied before (kube-public here) is
// undone: its project label released, its RoleBinding deleted; and a tombstone deleting a
// protected namespace releases it instead. An ordinary namespace is applied as ever.
func TestProtectedNamespacesAreNeverAdopted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	var err error
	if e.protected, err = protectedns.New("agent-ns"); err != nil {
		t.Fatal(err)
	}
	e.createNamespace(t, "agent-ns", nil)

	// An older agent adopted kube-public for p1 and bound p1's owner there.
	legacyNS := namespaceObj("kube-public", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_DELETE)
	legacyRB := roleBindingObj("kube-public", "fleetstream:p1:owner", "admin", "mallory")
	e.applyAsAgent(t, namespacesGVR, "", legacyNS)
	e.applyAsAgent(t, roleBindingsGVR, "kube-public", legacyRB)
	if err := e.managedNamespace(legacyNS, "p1")(); err != nil {
		t.Fatalf("the older agent's adoption: %v", err)
	}

	attack := []desiredObj{
		namespaceObj("kube-system", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED),
		quotaObj("kube-system", "fleetstream-quota", "10"),
		roleBindingObj("kube-system", "fleetstream:p1:owner", "admin", "mallory"),
		namespaceObj("default", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED),
		namespaceObj("agent-ns", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED),
		roleBindingObj("agent-ns", "fleetstream:p1:owner", "admin", "mallory"),
		legacyNS,
		legacyRB,
	}
	revs := map[string]uint64{}
	for _, d := range attack {
		revs[d.key()] = e.put(t, d)
	}
	ok := namespaceObj("team-a", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_UNSPECIFIED)
	okRB := roleBindingObj("team-a", "fleetstream:p1:owner", "admin", "alice")
	e.put(t, ok)
	e.put(t, okRB)
	e.start(t)

	testkit.Eventually(t, waitFor, e.managedNamespace(ok, "p1"))
	for _, d := range attack {
		st := e.waitStatus(t, d, revs[d.key()], failed, desired.ReasonProtectedNamespace)
		ns := d.namespace
		if d.kind == "Namespace" {
			ns = d.name
		}
		if !strings.Contains(st.Message, fmt.Sprintf("%q is protected", ns)) {
			t.Errorf("status of %s: %q does not say %s is protected", d.key(), st.Message, ns)
		}
	}
	for _, ns := range []string{"kube-system", "default", "agent-ns", "kube-public"} {
		testkit.Eventually(t, waitFor, e.unmanagedNamespace(ns))
	}
	testkit.Eventually(t, waitFor, func() error {
		for _, ns := range []string{"kube-system", "agent-ns", "kube-public"} {
			_, err := e.kube.Client.RbacV1().RoleBindings(ns).Get(e.ctx, "fleetstream:p1:owner", metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("RoleBinding in %s: %v, want none", ns, err)
			}
		}
		return nil
	})
	if _, err := e.kube.Client.CoreV1().ResourceQuotas("kube-system").Get(e.ctx, "fleetstream-quota", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("quota in kube-system: %v, want none", err)
	}
	testkit.Eventually(t, waitFor, func() error {
		_, err := e.kube.Client.RbacV1().RoleBindings("team-a").Get(e.ctx, "fleetstream:p1:owner", metav1.GetOptions{})
		return err // the ordinary namespace's RoleBinding
	})

	// The hub deletes kube-public (DELETE tombstone, as an unbind would): refused, not deleted.
	// Adopt it again as the older agent did, so a delete would be carried out if allowed.
	e.applyAsAgent(t, namespacesGVR, "", legacyNS)
	rev := e.put(t, tombstone(legacyNS, desiredv1.DeletionPolicy_DELETION_POLICY_DELETE))
	e.waitStatus(t, legacyNS, rev, failed, desired.ReasonProtectedNamespace)
	testkit.Eventually(t, waitFor, e.unmanagedNamespace("kube-public"))
}

// applyAsAgent server-side applies d's manifest with the agent's marks and field manager, as an
// agent that did not know the namespace was protected would have.
func (e *env) applyAsAgent(t *testing.T, gvr schema.GroupVersionResource, namespace string, d desiredObj) {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(d.obj.Manifest); err != nil {
		t.Fatal(err)
	}
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[desired.ManagedByLabel] = desired.ManagedByValue
	u.SetLabels(labels)
	u.SetAnnotations(map[string]string{desired.DesiredKeyAnnotation: d.bucket + "/" + d.key()})
	data, err := json.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	force := true
	ri := e.dyn.Resource(gvr).Namespace(namespace)
	if _, err := ri.Patch(e.ctx, u.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: desired.FieldManager, Force: &force}); err != nil {
		t.Fatalf("apply %s as an older agent: %v", d.key(), err)
	}
}
