package desired_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/mcs"
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
			"multicluster.kubernetes.io/service-name": "api", "multicluster.kubernetes.io/source-cluster": "c9", projectLabel: project,
			mcs.SliceManagedByLabel: mcs.SliceManager}},
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

// TestMCSBucketAppliesOnlyImportsAndSlices performs what a compromised endpoint-collector
// (the writer of desired-mcs, which reads untrusted agent input) could try: put a RoleBinding,
// an object whose key names another kind, or an EndpointSlice that kube-proxy would give to a
// local Service (kube-dns) into desired-mcs, into a namespace bound to the object's project.
// Each is refused, NotAllowed, and nothing is created; a well-formed slice applies.
func TestMCSBucketAppliesOnlyImportsAndSlices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.put(t, namespaceObj("web", "p1", desiredv1.DeletionPolicy_DELETION_POLICY_ORPHAN))
	e.start(t)
	testkit.Eventually(t, waitFor, e.managedNamespace(namespaceObj("web", "p1", 0), "p1"))

	ok := mcsSliceObj("web", "api.c9", "p1")
	rev := e.put(t, ok)
	e.waitStatus(t, ok, rev, desiredv1.Phase_PHASE_APPLIED, desired.ReasonApplied)

	rb := roleBindingObj("web", "mallory-admin", "cluster-admin", "mallory")
	rb.bucket = subjects.DesiredMCSBucket
	rb.obj.OwnerLabelKey, rb.obj.OwnerLabelValue, rb.obj.Owner = projectLabel, "p1", "endpoint-collector"
	// A RoleBinding's manifest behind a key that claims a ServiceImport.
	rbAsImport := rb
	rbAsImport.kind = mcs.ImportKind
	rbAsImport.name = "mallory-admin2"
	rbAsImport.obj = withManifestName(rb.obj, "mallory-admin2")
	// A slice behind a key that claims a ServiceImport.
	sliceAsImport := mcsSliceObj("web", "api.c8", "p1")
	sliceAsImport.kind = mcs.ImportKind
	hijack := mcsSliceObj("web", "kube-dns-hijack", "p1")
	hijack.obj = withLabel(hijack.obj, mcs.LocalServiceLabel, "kube-dns")
	unmanaged := mcsSliceObj("web", "api.c7", "p1")
	unmanaged.obj = withLabel(unmanaged.obj, mcs.SliceManagedByLabel, "endpointslice-controller.k8s.io")

	for _, tc := range []struct {
		name  string
		d     desiredObj
		exist func() error
	}{
		{"role binding", rb, func() error {
			_, err := e.kube.Client.RbacV1().RoleBindings("web").Get(e.ctx, "mallory-admin", metav1.GetOptions{})
			return err
		}},
		{"role binding keyed as an import", rbAsImport, func() error {
			_, err := e.kube.Client.RbacV1().RoleBindings("web").Get(e.ctx, "mallory-admin2", metav1.GetOptions{})
			return err
		}},
		{"slice keyed as an import", sliceAsImport, func() error {
			_, err := e.kube.Client.DiscoveryV1().EndpointSlices("web").Get(e.ctx, "api.c8", metav1.GetOptions{})
			return err
		}},
		{"slice labelled for a local service", hijack, func() error {
			_, err := e.kube.Client.DiscoveryV1().EndpointSlices("web").Get(e.ctx, "kube-dns-hijack", metav1.GetOptions{})
			return err
		}},
		{"slice without the MCS manager", unmanaged, func() error {
			_, err := e.kube.Client.DiscoveryV1().EndpointSlices("web").Get(e.ctx, "api.c7", metav1.GetOptions{})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rev := e.put(t, tc.d)
			e.waitStatus(t, tc.d, rev, desiredv1.Phase_PHASE_FAILED, desired.ReasonNotAllowed)
			if err := tc.exist(); !apierrors.IsNotFound(err) {
				t.Errorf("%s was created (%v), want none", tc.d.name, err)
			}
		})
	}
}

// withManifestName returns o with its manifest's metadata.name set to name.
func withManifestName(o *desiredv1.DesiredObject, name string) *desiredv1.DesiredObject {
	return editManifest(o, func(m map[string]any) { m["metadata"].(map[string]any)["name"] = name })
}

// withLabel returns o with its manifest's label k set to v.
func withLabel(o *desiredv1.DesiredObject, k, v string) *desiredv1.DesiredObject {
	return editManifest(o, func(m map[string]any) {
		md := m["metadata"].(map[string]any)
		l, _ := md["labels"].(map[string]any)
		if l == nil {
			l = map[string]any{}
		}
		l[k] = v
		md["labels"] = l
	})
}

func editManifest(o *desiredv1.DesiredObject, edit func(map[string]any)) *desiredv1.DesiredObject {
	var m map[string]any
	if err := json.Unmarshal(o.Manifest, &m); err != nil {
		panic(err)
	}
	edit(m)
	c := proto.Clone(o).(*desiredv1.DesiredObject)
	c.Manifest = mustJSON(m)
	return c
}
