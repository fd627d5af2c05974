package desired_test

import (
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
)

// mcsSliceObj is an imported EndpointSlice of project in namespace, as endpoint-collector's
// multi-cluster Services write them into desired-mcs.
func mcsSliceObj(namespace, name, project string) desiredObj {
	m := map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
		"metadata": map[string]any{"name": name, "namespace": namespace, "labels": map[string]any{
			"multicluster.kubernetes.io/service-name": "api", "multicluster.kubernetes.io/source-cluster": "c9", projectLabel: project}},
		"ports":     []any{map[string]any{"name": "http", "port": 8080, "protocol": "TCP"}},
		"endpoints": []any{map[string]any{"addresses": []any{"10.9.0.1"}, "conditions": map[string]any{"ready": true}}},
	}
	return desiredObj{bucket: subjects.DesiredMCSBucket, kind: "EndpointSlice.discovery.k8s.io", namespace: namespace, name: name,
		obj: &desiredv1.DesiredObject{Manifest: mustJSON(m), OwnerLabelKey: projectLabel, OwnerLabelValue: project, Owner: "endpoint-collector"}}
}

// TestMCSObjectsOnlyIntoBoundNamespaces: a hub that sends a project's imported endpoints into
// a namespace this agent did not bind to that project (another project's, one a cluster user
// labelled by hand, one that does not exist) is refused, NamespaceNotBound, and nothing is
// created there; into the project's own bound namespace they apply.
func TestMCSObjectsOnlyIntoBoundNamespaces(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	for ns, project := range map[string]string{"web": "p1", "theirs": "p2"} {
		d := namespaceObj(ns, project, desiredv1.DeletionPolicy_DELETION_POLICY_ORPHAN)
		e.put(t, d)
	}
	e.createNamespace(t, "hand-labelled", map[string]string{projectLabel: "p1"})
	e.start(t)
	testkit.Eventually(t, waitFor, e.managedNamespace(namespaceObj("theirs", "p2", 0), "p2"))

	ok := mcsSliceObj("web", "api.c9", "p1")
	rev := e.put(t, ok)
	e.waitStatus(t, ok, rev, desiredv1.Phase_PHASE_APPLIED, desired.ReasonApplied)
	for _, d := range []desiredObj{mcsSliceObj("theirs", "api.c9", "p1"), mcsSliceObj("hand-labelled", "api.c9", "p1"), mcsSliceObj("nowhere", "api.c9", "p1")} {
		rev := e.put(t, d)
		e.waitStatus(t, d, rev, desiredv1.Phase_PHASE_FAILED, desired.ReasonNamespaceNotBound)
		if _, err := e.kube.Client.DiscoveryV1().EndpointSlices(d.namespace).Get(e.ctx, d.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("slice in %s: %v, want none", d.namespace, fmt.Sprint(err))
		}
	}
}
