package charttest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/restmapper"
)

// operatorCRDs are the prometheus-operator CRDs of the kinds the hub chart renders when its
// monitoring values are on, copied from github.com/prometheus-operator/prometheus-operator@v0.85.0
// (testdata/prometheus-operator-crds/README.md says how to refresh them).
const operatorCRDs = "testdata/prometheus-operator-crds"

// operatorGroup is the API group of the prometheus-operator kinds.
const operatorGroup = "monitoring.coreos.com"

// chartRulesFile is the rule file the hub chart's PrometheusRule holds, relative to the
// repository root (the chart's files/fleetstream.rules.yaml is a symlink to it).
const chartRulesFile = "deploy/monitoring/rules/fleetstream.rules.yaml"

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installOperatorCRDs creates the prometheus-operator CRDs (for real: a dry run of a custom
// resource needs its CRD stored), waits until the apiserver serves them and refreshes the
// mapper. Installing twice is a no-op.
func (d *dryRunner) installOperatorCRDs(ctx context.Context, t *testing.T) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(operatorCRDs, "*.yaml"))
	must(t, "list CRDs", err)
	if len(files) != 2 {
		t.Fatalf("%d CRD files in %s, want the ServiceMonitor's and the PrometheusRule's", len(files), operatorCRDs)
	}
	for _, file := range files {
		f, err := os.Open(file)
		must(t, "open "+file, err)
		objs, err := decodeManifests(f)
		f.Close()
		must(t, "decode "+file, err)
		for _, crd := range objs {
			if _, err := d.dyn.Resource(crdResource).Get(ctx, crd.GetName(), metav1.GetOptions{}); err == nil {
				continue
			}
			_, err := d.dyn.Resource(crdResource).Create(ctx, crd, metav1.CreateOptions{})
			must(t, "create CRD "+crd.GetName(), err)
			must(t, "CRD "+crd.GetName()+" established", d.waitEstablished(ctx, crd.GetName()))
		}
	}
	if m, ok := d.mapper.(*restmapper.DeferredDiscoveryRESTMapper); ok {
		m.Reset()
	}
}

// waitEstablished waits until the apiserver reports the CRD Established (its kind is served).
func (d *dryRunner) waitEstablished(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		u, err := d.dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established: %w (last error %v)", name, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// usesOperatorKinds reports whether objs hold a prometheus-operator kind.
func usesOperatorKinds(objs []*unstructured.Unstructured) bool {
	for _, u := range objs {
		if u.GroupVersionKind().Group == operatorGroup {
			return true
		}
	}
	return false
}

// checkMonitoring checks what the schema cannot of the hub's monitoring objects: the
// PrometheusRule holds exactly the rule file promtool tests, and the ServiceMonitor selects
// every Service serving /metrics (the hub services and the gateway) on a port it has.
func checkMonitoring(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	var rules, monitors []*unstructured.Unstructured
	services := map[string]*unstructured.Unstructured{}
	for _, u := range objs {
		switch u.GetKind() {
		case "PrometheusRule":
			rules = append(rules, u)
		case "ServiceMonitor":
			monitors = append(monitors, u)
		case "Service":
			services[u.GetLabels()["app.kubernetes.io/name"]] = u
		}
	}
	if len(rules) != 1 || len(monitors) != 1 {
		t.Fatalf("%d PrometheusRules and %d ServiceMonitors, want one of each", len(rules), len(monitors))
	}
	f, err := os.Open(filepath.Join(repoRoot(t), chartRulesFile))
	must(t, "rules", err)
	want, err := decodeRuleFile(f)
	f.Close()
	must(t, "decode "+chartRulesFile, err)
	got, _, _ := unstructured.NestedFieldNoCopy(rules[0].Object, "spec")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the PrometheusRule's spec is not %s:\n%v\nwant\n%v", chartRulesFile, got, want)
	}

	sm := monitors[0]
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	exprs, _, _ := unstructured.NestedSlice(sm.Object, "spec", "selector", "matchExpressions")
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v, want one", endpoints)
	}
	port, _ := endpoints[0].(map[string]any)["port"].(string)
	path, _ := endpoints[0].(map[string]any)["path"].(string)
	if path != "/metrics" {
		t.Errorf("ServiceMonitor scrapes %q, want /metrics", path)
	}
	var selected []string
	for name, svc := range services {
		if matchesSelector(svc.GetLabels(), selector, exprs) {
			selected = append(selected, name)
			ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
			found := false
			for _, p := range ports {
				found = found || p.(map[string]any)["name"] == port
			}
			if !found {
				t.Errorf("ServiceMonitor selects Service %s, which has no port %q", svc.GetName(), port)
			}
		}
	}
	for _, want := range []string{"cluster-import", "namespace-binding", "rbac-sync", "endpoint-collector", "gateway"} {
		if !slices.Contains(selected, want) {
			t.Errorf("ServiceMonitor does not select the %s Service (selects %v)", want, selected)
		}
	}
	if slices.Contains(selected, "nats") {
		t.Errorf("ServiceMonitor selects the NATS Service, which serves no Prometheus metrics")
	}
}

// matchesSelector evaluates a label selector's matchLabels and In expressions (all the chart
// uses; another operator fails the check rather than being guessed at).
func matchesSelector(labels, matchLabels map[string]string, exprs []any) bool {
	for k, v := range matchLabels {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range exprs {
		m := e.(map[string]any)
		if m["operator"] != "In" {
			return false
		}
		values, _ := m["values"].([]any)
		in := false
		for _, v := range values {
			in = in || v == labels[m["key"].(string)]
		}
		if !in {
			return false
		}
	}
	return true
}

// decodeRuleFile decodes a Prometheus rule file as the chart's rendered objects are decoded, so
// the two compare value for value.
func decodeRuleFile(r io.Reader) (map[string]any, error) {
	var m map[string]any
	if err := yaml.NewYAMLOrJSONDecoder(r, 4096).Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}
