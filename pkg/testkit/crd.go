package testkit

import (
	"context"
	_ "embed"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// CAPIClusterCRD is a small stand-in for Cluster API's Cluster type (cluster.x-k8s.io/v1beta1
// clusters, an open schema), for tests of import policies.
//
//go:embed capi-cluster-crd.yaml
var CAPIClusterCRD []byte

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRD creates the CustomResourceDefinition in crdYAML (apiextensions.k8s.io/v1) and
// waits until it is established and its resource can be listed, so a test can create objects
// of it at once.
func (k *Kube) InstallCRD(t testing.TB, crdYAML []byte) {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(crdYAML, &obj.Object); err != nil {
		t.Fatalf("decode CRD: %v", err)
	}
	dyn, err := dynamic.NewForConfig(k.Config)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := dyn.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD %s: %v", obj.GetName(), err)
	}
	group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(obj.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(obj.Object, "spec", "versions")
	if len(versions) == 0 {
		t.Fatalf("CRD %s has no versions", obj.GetName())
	}
	version, _, _ := unstructured.NestedString(versions[0].(map[string]any), "name")
	gvr := schema.GroupVersionResource{Group: group, Version: version, Resource: plural}
	Eventually(t, 30*time.Second, func() error {
		if _, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return fmt.Errorf("list %s: %w", gvr, err)
		}
		return nil
	})
}
