package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

func TestImportPreviewEndToEnd(t *testing.T) {
	e := startClusterService(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const token = "do-not-print-this-token"
	kubeconfig := base64.StdEncoding.EncodeToString([]byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: https://10.0.0.9:6443}\n" +
		"contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: " + token + "}\n"))
	policy := write("policy.yaml", `name: capi
source: {cluster: mgmt, group: cluster.x-k8s.io, version: v1beta1, resource: clusters}
references:
- {key: kubeconfig, version: v1, resource: secrets, namespaceTemplate: "{{ .source.metadata.namespace }}", nameTemplate: "{{ .source.metadata.name }}-kubeconfig"}
nameTemplate: "capi-{{ .source.metadata.name }}"
template: |
  labels:
    env: "{{ .source.metadata.labels.env }}"
  credentials:
    kubeconfig: "{{ .references.kubeconfig.data.value }}"
creationCondition: "true"
`)
	source := write("cluster.yaml", "apiVersion: cluster.x-k8s.io/v1beta1\nkind: Cluster\nmetadata: {name: prod-eu, namespace: fleet, labels: {env: prod}}\n")
	secret := write("secret.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: prod-eu-kubeconfig, namespace: fleet}\ndata: {value: "+kubeconfig+"}\n")

	out := e.run(t, "import", "preview", "-f", policy, "--source", source, "--ref", "kubeconfig="+secret).ok(t).stdout
	for _, want := range []string{"capi-prod-eu", "true", "env=prod", "rendered (not shown)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	js := e.run(t, "import", "preview", "-f", policy, "--source", source, "--ref", "kubeconfig="+secret, "-o", "json").ok(t).stdout
	if strings.Contains(out+js, token) || strings.Contains(out+js, kubeconfig[:32]) {
		t.Fatalf("a credential was printed:\n%s\n%s", out, js)
	}
	// The same file stores the policy once its source cluster is registered.
	e.run(t, "cluster", "register", "mgmt").ok(t)
	out = e.run(t, "import", "policy", "create", "-f", policy).ok(t).stdout
	if !strings.Contains(out, "capi") || !strings.Contains(out, "clusters.cluster.x-k8s.io") {
		t.Fatalf("create:\n%s", out)
	}
	if out := e.run(t, "import", "policy", "list").ok(t).stdout; !strings.Contains(out, "mgmt") {
		t.Fatalf("list:\n%s", out)
	}
	e.run(t, "import", "policy", "delete", "capi").ok(t)
	if r := e.run(t, "import", "policy", "get", "capi"); r.code == 0 {
		t.Fatalf("get after delete: %s", r.stdout)
	}
	// Without the reference the preview names the problem and fleetctl fails.
	r := e.run(t, "import", "preview", "-f", policy, "--source", source)
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "kubeconfig") {
		t.Fatalf("missing reference: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}

func TestImportLifecyclesCommand(t *testing.T) {
	e := startClusterService(t)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(`name: capi
source: {cluster: mgmt, group: cluster.x-k8s.io, version: v1beta1, resource: clusters}
nameTemplate: "capi-{{ .source.metadata.name }}"
template: |
  labels:
    provider: capi
creationCondition: '{{ eq .source.spec.paused false }}'
`), 0o600); err != nil {
		t.Fatal(err)
	}
	e.run(t, "cluster", "register", "mgmt").ok(t)
	e.run(t, "import", "policy", "create", "-f", policy).ok(t)
	// What mgmt's agent reports: one Cluster ready to import, one paused.
	store := events.NewStore(e.js.JS, "system:cluster-agent:mgmt")
	for name, paused := range map[string]bool{"prod-eu": false, "staging": true} {
		obj := fmt.Sprintf(`{"apiVersion":"cluster.x-k8s.io/v1beta1","kind":"Cluster","metadata":{"name":%q,"namespace":"fleet"},"spec":{"paused":%v}}`, name, paused)
		if _, err := store.Append(context.Background(), subjects.AgentImportObject("mgmt", "cluster.x-k8s.io", "clusters", "fleet", name), "mgmt", events.Any,
			&agentv1.ImportObject{ClusterName: "mgmt", Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters", Namespace: "fleet", Name: name, Object: []byte(obj)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		source string
		want   []string
	}{
		{"fleet/prod-eu", []string{"capi-prod-eu", "created"}},
		{"fleet/staging", []string{"capi-staging", "Created: CreationConditionFalse"}},
	} {
		testkit.Eventually(t, 20*time.Second, func() error {
			out := e.run(t, "import", "lifecycles", "capi").ok(t).stdout
			for _, line := range strings.Split(out, "\n") {
				if !strings.HasPrefix(line, tc.source+" ") {
					continue
				}
				for _, w := range tc.want {
					if !strings.Contains(line, w) {
						return fmt.Errorf("%s: line lacks %q:\n%s", tc.source, w, out)
					}
				}
				return nil
			}
			return fmt.Errorf("no lifecycle for %s:\n%s", tc.source, out)
		})
	}
	if out := e.run(t, "cluster", "get", "capi-prod-eu").ok(t).stdout; !strings.Contains(out, "provider=capi") {
		t.Errorf("imported cluster:\n%s", out)
	}
	if r := e.run(t, "import", "lifecycles", "no-such-policy"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("unknown policy: exit %d\n%s", r.code, r.stderr)
	}
}

// `import policy get` prints the policy's conditions under it, and `list` whether it is
// validated: here its inventory agent reports that the cluster does not serve the source type.
func TestImportPolicyGetShowsConditions(t *testing.T) {
	e := startClusterService(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte(`name: capi
source: {cluster: mgmt, group: cluster.x-k8s.io, resource: clusters}
nameTemplate: "capi-{{ .source.metadata.name }}"
template: "labels: {provider: capi}"
creationCondition: "true"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	e.run(t, "cluster", "register", "mgmt").ok(t)
	e.run(t, "import", "policy", "create", "-f", policy).ok(t)
	if out := e.run(t, "import", "policy", "get", "capi").ok(t).stdout; !strings.Contains(out, "Validated=Unknown WaitingForAgent") {
		t.Fatalf("before the agent reports:\n%s", out)
	}
	store := events.NewStore(e.js.JS, "system:cluster-agent:mgmt")
	if _, err := store.Append(context.Background(), subjects.AgentImportWatchStatus("mgmt"), "mgmt", events.Any, &agentv1.ImportWatchStatus{ClusterName: "mgmt",
		Types: []*agentv1.WatchedTypeStatus{{Group: "cluster.x-k8s.io", Resource: "clusters", Source: true, Reason: "NotServed",
			Message: "resolve clusters.cluster.x-k8s.io: no matches for cluster.x-k8s.io/, Resource=clusters"}}}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		out := e.run(t, "import", "policy", "get", "capi").ok(t).stdout
		for _, want := range []string{
			`Validated=False FailedNegotiateSourceResource: cluster "mgmt" does not serve clusters.cluster.x-k8s.io: resolve clusters.cluster.x-k8s.io: no matches for`,
			"SourceWatched=False NotServed",
			"ReferencesResolved=True NoReferences",
		} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("get lacks %q:\n%s", want, out)
			}
		}
		return nil
	})
	if out := e.run(t, "import", "policy", "list").ok(t).stdout; !strings.Contains(out, "False (FailedNegotiateSourceResource)") {
		t.Fatalf("list:\n%s", out)
	}
}
