package charttest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// manifestsEnv names a directory of rendered charts, one `helm template` output per *.yaml
// file (make chart-check renders them). Hub renders are named hub-*.yaml, agent renders
// agent-*.yaml.
const manifestsEnv = "FLEETSTREAM_CHART_MANIFESTS"

// dryRunner applies objects to a real kube-apiserver with a server-side dry run: the apiserver
// decodes, defaults, validates (unknown fields included) and admits each object, and stores
// nothing.
type dryRunner struct {
	kube   *testkit.Kube
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newDryRunner(t *testing.T, k *testkit.Kube) *dryRunner {
	t.Helper()
	dyn, err := dynamic.NewForConfig(k.Config)
	must(t, "dynamic client", err)
	return &dryRunner{kube: k, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(k.Client.Discovery()))}
}

func (d *dryRunner) apply(ctx context.Context, u *unstructured.Unstructured) error {
	gvk := u.GroupVersionKind()
	m, err := d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s %s: %w", gvk, u.GetName(), err)
	}
	var ri dynamic.ResourceInterface = d.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if u.GetNamespace() == "" {
			return fmt.Errorf("%s %s: a namespaced object without metadata.namespace", gvk.Kind, u.GetName())
		}
		ri = d.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	} else if u.GetNamespace() != "" {
		return fmt.Errorf("%s %s: a cluster-scoped object with metadata.namespace %q", gvk.Kind, u.GetName(), u.GetNamespace())
	}
	data, err := json.Marshal(u.Object)
	if err != nil {
		return err
	}
	force := true
	_, err = ri.Patch(ctx, u.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
		DryRun: []string{metav1.DryRunAll}, FieldManager: "chart-check", Force: &force,
		FieldValidation: metav1.FieldValidationStrict,
	})
	if err != nil {
		return fmt.Errorf("%s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// ensureNamespaces creates (for real) the namespaces objs live in: the release namespace
// exists before `helm install` runs.
func (d *dryRunner) ensureNamespaces(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, u := range objs {
		ns := u.GetNamespace()
		if ns == "" {
			continue
		}
		_, err := d.kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	return nil
}

// TestChartsDryRun applies every rendered object of both charts with a server-side dry run. It
// first shows the dry run refuses what a broken template would produce, so a pass means
// something; the rendered charts are checked only when make chart-check provides them.
func TestChartsDryRun(t *testing.T) {
	k := testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	d := newDryRunner(t, k)
	must(t, "namespace", d.ensureNamespaces(ctx, []*unstructured.Unstructured{obj("v1", "ConfigMap", "probe", "x", nil)}))

	t.Run("refuses invalid objects", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			obj  *unstructured.Unstructured
			want string // "" = accepted
		}{
			{"valid", obj("v1", "ConfigMap", "probe", "ok", map[string]any{"data": map[string]any{"a": "b"}}), ""},
			{"unknown field", obj("v1", "ConfigMap", "probe", "typo", map[string]any{"datta": map[string]any{"a": "b"}}), "datta"},
			{"wrong type", obj("apps/v1", "Deployment", "probe", "bad", map[string]any{"spec": map[string]any{"replicas": "two"}}), "replicas"},
			{"invalid deployment", obj("apps/v1", "Deployment", "probe", "empty", map[string]any{"spec": map[string]any{}}), "selector"},
			{"unknown kind", obj("example.com/v1", "Widget", "probe", "w", nil), "Widget"},
			{"namespaced without namespace", obj("v1", "ConfigMap", "", "nowhere", nil), "without metadata.namespace"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := d.apply(ctx, tc.obj)
				switch {
				case tc.want == "" && err != nil:
					t.Fatalf("refused: %v", err)
				case tc.want != "" && err == nil:
					t.Fatalf("accepted, want an error naming %q", tc.want)
				case tc.want != "" && !strings.Contains(err.Error(), tc.want):
					t.Fatalf("error %v does not name %q", err, tc.want)
				}
			})
		}
		// A dry run stores nothing.
		if _, err := k.Client.CoreV1().ConfigMaps("probe").Get(ctx, "ok", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the dry-run ConfigMap exists: %v", err)
		}
	})

	// The prometheus-operator kinds the hub chart renders when its monitoring values are on:
	// with their CRDs installed, the dry run validates them against the operator's schema.
	t.Run("prometheus-operator kinds", func(t *testing.T) {
		d.installOperatorCRDs(ctx, t)
		monitor := func(endpoint map[string]any) *unstructured.Unstructured {
			return obj("monitoring.coreos.com/v1", "ServiceMonitor", "probe", "m", map[string]any{"spec": map[string]any{
				"selector": map[string]any{"matchLabels": map[string]any{"app": "x"}}, "endpoints": []any{endpoint}}})
		}
		rule := func(r map[string]any) *unstructured.Unstructured {
			return obj("monitoring.coreos.com/v1", "PrometheusRule", "probe", "r", map[string]any{"spec": map[string]any{
				"groups": []any{map[string]any{"name": "g", "rules": []any{r}}}}})
		}
		for _, tc := range []struct {
			name string
			obj  *unstructured.Unstructured
			want string // "" = accepted
		}{
			{"ServiceMonitor", monitor(map[string]any{"port": "http", "path": "/metrics", "interval": "30s"}), ""},
			{"ServiceMonitor unknown field", monitor(map[string]any{"port": "http", "pth": "/metrics"}), "pth"},
			{"ServiceMonitor bad interval", monitor(map[string]any{"port": "http", "interval": "soon"}), "interval"},
			{"PrometheusRule", rule(map[string]any{"alert": "A", "expr": "up == 0", "for": "5m"}), ""},
			{"PrometheusRule unknown field", rule(map[string]any{"alert": "A", "expr": "up == 0", "runbook": "x"}), "runbook"},
			{"PrometheusRule without expr", rule(map[string]any{"alert": "A"}), "expr"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				err := d.apply(ctx, tc.obj)
				switch {
				case tc.want == "" && err != nil:
					t.Fatalf("refused: %v", err)
				case tc.want != "" && err == nil:
					t.Fatalf("accepted, want an error naming %q", tc.want)
				case tc.want != "" && !strings.Contains(err.Error(), tc.want):
					t.Fatalf("error %v does not name %q", err, tc.want)
				}
			})
		}
	})

	dir := os.Getenv(manifestsEnv)
	if dir == "" {
		t.Skipf("%s is not set: make chart-check renders the charts and runs this test with it", manifestsEnv)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	must(t, "list rendered charts", err)
	if len(files) == 0 {
		t.Fatalf("no rendered charts (*.yaml) in %s", dir)
	}
	rules := agentRules(t)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			f, err := os.Open(file)
			must(t, "open", err)
			objs, err := decodeManifests(f)
			f.Close()
			must(t, "decode "+file, err)
			if len(objs) == 0 {
				t.Fatalf("%s renders no object", file)
			}
			must(t, "namespaces", d.ensureNamespaces(ctx, objs))
			if usesOperatorKinds(objs) {
				d.installOperatorCRDs(ctx, t)
			}
			kinds := map[string]int{}
			for _, u := range objs {
				kinds[u.GetKind()]++
				if err := d.apply(ctx, u); err != nil {
					t.Errorf("dry run: %v", err)
				}
			}
			t.Logf("%d objects accepted: %v", len(objs), kinds)
			switch base := filepath.Base(file); {
			case strings.HasPrefix(base, "hub-"):
				checkHub(t, objs, base == "hub-default.yaml")
				if usesOperatorKinds(objs) {
					checkMonitoring(t, objs)
				}
			case strings.HasPrefix(base, "agent-"):
				checkAgent(t, objs, rules)
			default:
				t.Fatalf("%s: want a hub-*.yaml or agent-*.yaml render", base)
			}
		})
	}
}

// checkHub checks what a schema cannot: the parts of the hub are all there and the NATS config
// is one nats-server accepts, with JetStream, every node routed and the auth callout on.
// A render with the kube bridge also gets checkKubeBridge; the default render must not have it
// (off unless kubeBridge.enabled).
func checkHub(t *testing.T, objs []*unstructured.Unstructured, defaults bool) {
	t.Helper()
	var deployments []string
	var natsSets, configs []*unstructured.Unstructured
	for _, u := range objs {
		switch u.GetKind() {
		case "Deployment":
			deployments = append(deployments, u.GetLabels()["app.kubernetes.io/name"])
		case "StatefulSet":
			natsSets = append(natsSets, u)
		case "ConfigMap":
			if _, ok, _ := unstructured.NestedString(u.Object, "data", "nats.conf"); ok {
				configs = append(configs, u)
			}
		}
	}
	sort.Strings(deployments)
	want := []string{"cluster-import", "endpoint-collector", "gateway", "hosted-agent", "namespace-binding", "rbac-sync"}
	if slices.Contains(deployments, "kube-bridge") {
		if defaults {
			t.Errorf("the default values render the kube bridge; it is off unless kubeBridge.enabled")
		}
		want = append(want[:4], append([]string{"kube-bridge"}, want[4:]...)...)
		checkKubeBridge(t, objs)
	}
	if !reflect.DeepEqual(deployments, want) {
		t.Errorf("deployments %v, want %v", deployments, want)
	}
	if len(natsSets) != 1 || len(configs) != 1 {
		t.Fatalf("%d NATS StatefulSets and %d NATS ConfigMaps, want one of each", len(natsSets), len(configs))
	}
	// JSON numbers decode as float64.
	v, _, _ := unstructured.NestedFieldNoCopy(natsSets[0].Object, "spec", "replicas")
	f, _ := v.(float64)
	replicas := int(f)
	if replicas != 3 {
		t.Errorf("NATS StatefulSet of %d replicas, want 3", replicas)
	}
	data, _, _ := unstructured.NestedStringMap(configs[0].Object, "data")
	dir := t.TempDir()
	for _, name := range []string{"nats.conf", "auth.conf"} {
		if data[name] == "" {
			t.Fatalf("NATS ConfigMap without %s", name)
		}
		must(t, "write "+name, os.WriteFile(filepath.Join(dir, name), []byte(data[name]), 0o600))
	}
	// What the pod's environment provides: its name and the natsAuth Secret's keys.
	issuer, err := nkeys.CreateAccount()
	must(t, "issuer key", err)
	issuerPub, err := issuer.PublicKey()
	must(t, "issuer public key", err)
	xkey, err := nkeys.CreateCurveKeys()
	must(t, "xkey", err)
	xkeyPub, err := xkey.PublicKey()
	must(t, "xkey public key", err)
	t.Setenv("SERVER_NAME", "fleetstream-nats-1")
	t.Setenv("NATS_CALLOUT_PASSWORD", "a-password")
	t.Setenv("NATS_CALLOUT_ISSUER", issuerPub)
	t.Setenv("NATS_CALLOUT_XKEY", xkeyPub)
	t.Setenv("NATS_ADMIN_PASSWORD", "an-admin-password")
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("nats-server refuses the rendered config: %v\n%s", err, data["nats.conf"])
	}
	switch {
	case opts.ServerName != "fleetstream-nats-1":
		t.Errorf("server_name %q, want the pod's name", opts.ServerName)
	case !opts.JetStream || opts.StoreDir != "/data":
		t.Errorf("jetstream %v in %q, want on in /data", opts.JetStream, opts.StoreDir)
	case len(opts.Routes) != replicas:
		t.Errorf("%d routes, want one per node: %v", len(opts.Routes), opts.Routes)
	case opts.AuthCallout == nil || opts.AuthCallout.Issuer != issuerPub || opts.AuthCallout.XKey != xkeyPub:
		t.Errorf("auth callout %+v, want issuer and xkey from the environment", opts.AuthCallout)
	case !staticUsers(opts.Users, "a-password", "an-admin-password"):
		t.Errorf("static users %v, want only cluster-import and cluster-import-system (system account) with the environment's password, and fleetstream-admin with its own", opts.Users)
	}
	// The server's own validation of the options (what it checks before listening).
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server refuses the rendered options: %v", err)
	}
	s.Shutdown()
}

// checkKubeBridge checks the kube bridge's identity on the hub: with an in-cluster hub, its
// ClusterRole is exactly the rules file fleetd's bridge tests run the bridge as, bound to the
// ServiceAccount its pod runs as; with another hub's kubeconfig, it gets no rights here at all.
func checkKubeBridge(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	var deployment *unstructured.Unstructured
	var roles, bindings []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetLabels()["app.kubernetes.io/name"] != "kube-bridge" {
			continue
		}
		switch u.GetKind() {
		case "Deployment":
			deployment = u
		case "ClusterRole":
			roles = append(roles, u)
		case "ClusterRoleBinding":
			bindings = append(bindings, u)
		}
	}
	args, _, _ := unstructured.NestedSlice(deployment.Object, "spec", "template", "spec", "containers")
	inCluster := strings.Contains(fmt.Sprint(args), "--kube-bridge-in-cluster")
	automount, _, _ := unstructured.NestedBool(deployment.Object, "spec", "template", "spec", "automountServiceAccountToken")
	if !inCluster {
		if len(roles)+len(bindings) != 0 || automount {
			t.Errorf("a bridge of another hub has %d ClusterRoles, %d bindings and a mounted ServiceAccount token %v here, want none", len(roles), len(bindings), automount)
		}
		return
	}
	if len(roles) != 1 || len(bindings) != 1 || !automount {
		t.Fatalf("an in-cluster bridge with %d ClusterRoles, %d ClusterRoleBindings, ServiceAccount token %v, want one, one, mounted", len(roles), len(bindings), automount)
	}
	got, err := rulesOf(roles[0])
	must(t, "rules", err)
	if want := kubeBridgeRules(t); !reflect.DeepEqual(got, want) {
		t.Errorf("the bridge's ClusterRole rules\n%v\nare not %s:\n%v", got, kubeBridgeRulesFile, want)
	}
	sa, _, _ := unstructured.NestedString(deployment.Object, "spec", "template", "spec", "serviceAccountName")
	subjects, _, _ := unstructured.NestedSlice(bindings[0].Object, "subjects")
	roleRef, _, _ := unstructured.NestedString(bindings[0].Object, "roleRef", "name")
	if sa == "" || len(subjects) != 1 || subjects[0].(map[string]any)["name"] != sa || subjects[0].(map[string]any)["namespace"] != deployment.GetNamespace() || roleRef != roles[0].GetName() {
		t.Errorf("binding %v of %s does not bind ClusterRole %s to the bridge's ServiceAccount %s/%s",
			subjects, roleRef, roles[0].GetName(), deployment.GetNamespace(), sa)
	}
}

// staticUsers reports whether users are exactly the callout's responder and the system account
// user cluster-import closes revoked connections with, both with password.
func staticUsers(users []*server.User, password, adminPassword string) bool {
	if len(users) != 3 {
		return false
	}
	seen := map[string]bool{}
	for _, u := range users {
		want := password
		if u.Username == "fleetstream-admin" {
			want = adminPassword
		}
		if u.Password != want {
			return false
		}
		acc := ""
		if u.Account != nil {
			acc = u.Account.Name
		}
		seen[u.Username+"@"+acc] = true
	}
	return (seen["cluster-import@"] || seen["cluster-import@$G"]) && seen["cluster-import-system@SYS"] &&
		(seen["fleetstream-admin@"] || seen["fleetstream-admin@$G"])
}

// checkAgent checks the agent's ClusterRole starts with exactly the shared rules file the
// least-privilege test runs the agent with (values may add rules after them), and that the
// agent runs as the ServiceAccount that ClusterRole is bound to.
func checkAgent(t *testing.T, objs []*unstructured.Unstructured, want []rbacv1.PolicyRule) {
	t.Helper()
	var roles, bindings, deployments, policies []*unstructured.Unstructured
	for _, u := range objs {
		switch u.GetKind() {
		case "ValidatingAdmissionPolicy":
			policies = append(policies, u)
		case "ClusterRole":
			roles = append(roles, u)
		case "ClusterRoleBinding":
			bindings = append(bindings, u)
		case "Deployment":
			deployments = append(deployments, u)
		}
	}
	if len(roles) != 1 || len(bindings) != 1 || len(deployments) != 1 {
		t.Fatalf("%d ClusterRoles, %d ClusterRoleBindings, %d Deployments, want one of each", len(roles), len(bindings), len(deployments))
	}
	got, err := rulesOf(roles[0])
	must(t, "rules", err)
	if len(got) < len(want) || !reflect.DeepEqual(got[:len(want)], want) {
		t.Errorf("ClusterRole rules\n%v\ndo not start with %s:\n%v", got, agentRulesFile, want)
	}
	sa, _, _ := unstructured.NestedString(deployments[0].Object, "spec", "template", "spec", "serviceAccountName")
	subjects, _, _ := unstructured.NestedSlice(bindings[0].Object, "subjects")
	roleRef, _, _ := unstructured.NestedString(bindings[0].Object, "roleRef", "name")
	if len(subjects) != 1 || subjects[0].(map[string]any)["name"] != sa || subjects[0].(map[string]any)["namespace"] != deployments[0].GetNamespace() || roleRef != roles[0].GetName() {
		t.Errorf("binding %v of %s does not bind ClusterRole %s to the agent's ServiceAccount %s/%s",
			subjects, roleRef, roles[0].GetName(), deployments[0].GetNamespace(), sa)
	}
	// The admission policy that narrows escalate and bind applies to that ServiceAccount.
	if len(policies) != 1 {
		t.Fatalf("%d ValidatingAdmissionPolicies, want the agent's", len(policies))
	}
	conds, _, _ := unstructured.NestedSlice(policies[0].Object, "spec", "matchConditions")
	user := "system:serviceaccount:" + deployments[0].GetNamespace() + ":" + sa
	if len(conds) != 1 || !strings.Contains(fmt.Sprint(conds[0]), strconv.Quote(user)) {
		t.Errorf("admission policy matches %v, want the agent's user %s", conds, user)
	}
}

func obj(apiVersion, kind, namespace, name string, fields map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind}}
	for k, v := range fields {
		u.Object[k] = v
	}
	u.SetName(name)
	u.SetNamespace(namespace)
	return u
}
