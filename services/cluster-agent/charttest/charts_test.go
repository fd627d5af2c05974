// Package charttest proves the Helm charts of deploy/helm: every object they render is accepted
// by a real kube-apiserver (server-side dry run, strict field validation), the hub's NATS
// config parses, and the cluster agent does its whole job as the chart's ClusterRole and no
// more.
package charttest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// agentRulesFile is the agent's least-privilege rules, relative to the repository root: the
// chart's ClusterRole includes it verbatim and TestAgentWithChartClusterRole runs the agent
// with exactly these rules.
const agentRulesFile = "deploy/helm/cluster-agent/files/clusterrole-rules.yaml"

// kubeBridgeRulesFile is the kube bridge's ClusterRole rules on its hub: the hub chart includes
// it verbatim and fleetd's kube-bridge tests run the bridge with exactly these rules.
const kubeBridgeRulesFile = "deploy/helm/fleetstream/files/kube-bridge-clusterrole-rules.yaml"

// agentPolicyFile is the admission policy that narrows the agent's escalate and bind to the
// fleet's ClusterRoles; the chart fills in its placeholders as agentPolicy does.
const agentPolicyFile = "deploy/helm/cluster-agent/files/admission-policy.yaml"

// repoRoot walks up from the package directory to the directory holding go.work.
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.work above the working directory")
		}
		dir = parent
	}
}

// agentRules reads the chart's ClusterRole rules of the cluster agent.
func agentRules(t testing.TB) []rbacv1.PolicyRule {
	t.Helper()
	return readRules(t, agentRulesFile)
}

// kubeBridgeRules reads the hub chart's ClusterRole rules of the kube bridge.
func kubeBridgeRules(t testing.TB) []rbacv1.PolicyRule {
	t.Helper()
	return readRules(t, kubeBridgeRulesFile)
}

func readRules(t testing.TB, file string) []rbacv1.PolicyRule {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), file))
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	defer f.Close()
	var rules []rbacv1.PolicyRule
	if err := yaml.NewYAMLOrJSONDecoder(f, 4096).Decode(&rules); err != nil {
		t.Fatalf("decode %s: %v", file, err)
	}
	if len(rules) == 0 {
		t.Fatalf("%s holds no rules", file)
	}
	return rules
}

// agentPolicy reads the chart's admission policy and its binding for the ServiceAccount user
// and the protected namespace patterns, as templates/admission-policy.yaml renders them.
func agentPolicy(t testing.TB, user string, protected []string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), agentPolicyFile))
	if err != nil {
		t.Fatalf("agent policy: %v", err)
	}
	list, err := json.Marshal(protected)
	if err != nil {
		t.Fatal(err)
	}
	rendered := strings.NewReplacer("AGENT_USER", user, "PROTECTED_NAMESPACES", string(list)).Replace(string(data))
	objs, err := decodeManifests(strings.NewReader(rendered))
	if err != nil {
		t.Fatalf("decode %s: %v", agentPolicyFile, err)
	}
	return objs
}

// decodeManifests returns every object of a multi-document YAML stream, skipping empty
// documents (helm template leaves some).
func decodeManifests(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := yaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", len(out)+1, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("document %d has no kind or apiVersion: %v", len(out)+1, m)
		}
		out = append(out, u)
	}
}

// rulesOf decodes an unstructured ClusterRole's rules.
func rulesOf(u *unstructured.Unstructured) ([]rbacv1.PolicyRule, error) {
	data, err := json.Marshal(u.Object)
	if err != nil {
		return nil, err
	}
	var cr rbacv1.ClusterRole
	if err := json.Unmarshal(data, &cr); err != nil {
		return nil, fmt.Errorf("clusterrole %s: %w", u.GetName(), err)
	}
	return cr.Rules, nil
}

// must fails t on err, naming what was being done.
func must(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}
