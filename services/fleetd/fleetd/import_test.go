package fleetd_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

var capiClusters = schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters"}

// reachable connects with the stored credentials of cluster and lists namespaces there: the
// imported connection works against the real API server.
func reachable(ctx context.Context, inst *fleetd.Instance, cluster string) error {
	creds, err := inst.ClusterImport.Credentials(ctx, cluster)
	if err != nil {
		return err
	}
	if len(creds.GetKubeconfig()) == 0 {
		return fmt.Errorf("cluster %s has no kubeconfig", cluster)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(creds.GetKubeconfig())
	if err != nil {
		return err
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	_, err = kc.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	return err
}

// Import end to end: Cluster API-like Clusters and their kubeconfig Secrets on a real
// inventory apiserver, reported by a real agent under its own NATS permissions, imported by
// cluster-import into clusters whose stored credentials reach two other real apiservers.
func TestImportPolicyImportsClusterAPIClusters(t *testing.T) {
	inst, client := startFleetd(t)
	inv, w1, w2 := testkit.StartKube(t), testkit.StartKube(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 4*time.Minute)
	inv.InstallCRD(t, testkit.CAPIClusterCRD)
	dyn, err := dynamic.NewForConfig(inv.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inv.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "capi"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	capi := dyn.Resource(capiClusters).Namespace("capi")
	putCluster := func(name string, ready bool) {
		t.Helper()
		status := "False"
		if ready {
			status = "True"
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
			"metadata": map[string]any{"name": name, "namespace": "capi", "labels": map[string]any{"env": "prod"}},
			"status":   map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": status}}},
		}}
		cur, err := capi.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			cur, err = capi.Create(ctx, u, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("create Cluster %s: %v", name, err)
		}
		// Status is a subresource, as in Cluster API.
		u.SetResourceVersion(cur.GetResourceVersion())
		if _, err := capi.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update status of Cluster %s: %v", name, err)
		}
	}
	putSecret := func(name string, kubeconfig []byte) {
		t.Helper()
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-kubeconfig", Namespace: "capi"}, Data: map[string][]byte{"value": kubeconfig}}
		if _, err := inv.Client.CoreV1().Secrets("capi").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			if _, err := inv.Client.CoreV1().Secrets("capi").Create(ctx, s, metav1.CreateOptions{}); err != nil {
				t.Fatalf("put Secret %s: %v", s.Name, err)
			}
		}
	}
	putCluster("alpha", true)
	putCluster("beta", true)
	putSecret("alpha", w1.Kubeconfig)
	putSecret("beta", w2.Kubeconfig)

	// mgmt is the inventory cluster, with its agent; beta was registered by hand before.
	reg, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "mgmt"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "beta", Labels: map[string]string{"owner": "ops"}})); err != nil {
		t.Fatal(err)
	}
	natsErrs := make(chan error, 1)
	nc, err := connectAgent(inst, "mgmt", reg.Msg.AgentToken, natsErrs)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{ClusterName: "mgmt", HeartbeatInterval: time.Second}, js, inv.Client, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	a.Add(agent.NewImportWatcher(a, dyn, inv.Client.Discovery(), agent.ImportWatchConfig{SecretResend: time.Second}))
	actx, stopAgent := context.WithCancel(ctx)
	agentDone := make(chan error, 1)
	go func() { agentDone <- a.Run(actx) }()
	t.Cleanup(func() { stopAgent(); <-agentDone })

	pc := clusterv1connect.NewImportPolicyServiceClient(http.DefaultClient, "http://"+inst.Addr,
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+apiToken)
				return next(ctx, req)
			}
		})))
	policy := &clusterv1.ImportPolicy{
		Name:   "capi",
		Source: &clusterv1.ImportSource{Cluster: "mgmt", Group: "cluster.x-k8s.io", Resource: "clusters"},
		References: []*clusterv1.ImportReference{{Key: "kubeconfig", Version: "v1", Resource: "secrets",
			NamespaceTemplate: "{{ .source.metadata.namespace }}", NameTemplate: "{{ .source.metadata.name }}-kubeconfig"}},
		NameTemplate: "{{ .source.metadata.name }}",
		Template: `labels:
  provider: capi
  env: "{{ .source.metadata.labels.env }}"
credentials:
  kubeconfig: "{{ .references.kubeconfig.data.value }}"
`,
		CreationCondition: `{{ range .source.status.conditions }}{{ if and (eq .type "Ready") (eq .status "True") }}true{{ end }}{{ end }}`,
	}
	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: policy})); err != nil {
		t.Fatal(err)
	}
	get := func(name string) (*clusterv1.Cluster, error) {
		res, err := client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: name}))
		if err != nil {
			return nil, err
		}
		return res.Msg.Cluster, nil
	}
	lifecycles := func() (map[string]*clusterv1.ImportLifecycle, error) {
		res, err := pc.ListImportLifecycles(ctx, connect.NewRequest(&clusterv1.ListImportLifecyclesRequest{Policy: "capi"}))
		if err != nil {
			return nil, err
		}
		out := map[string]*clusterv1.ImportLifecycle{}
		for _, lc := range res.Msg.Lifecycles {
			out[lc.Source.Name] = lc
		}
		return out, nil
	}

	testkit.Eventually(t, 90*time.Second, func() error {
		lcs, err := lifecycles()
		if err != nil {
			return err
		}
		if lcs["alpha"].GetMode() != clusterv1.ImportMode_IMPORT_MODE_CREATED || lcs["beta"].GetMode() != clusterv1.ImportMode_IMPORT_MODE_ADOPTED {
			return fmt.Errorf("lifecycles: %v", lcs)
		}
		alpha, err := get("alpha")
		if err != nil {
			return err
		}
		if alpha.Labels["provider"] != "capi" || alpha.Labels["env"] != "prod" {
			return fmt.Errorf("alpha labels %v", alpha.Labels)
		}
		beta, err := get("beta")
		if err != nil {
			return err
		}
		if beta.Labels["owner"] != "ops" || beta.Labels["provider"] != "" || !beta.Status.CredentialsSet {
			return fmt.Errorf("beta %v", beta)
		}
		if err := reachable(ctx, inst, "alpha"); err != nil {
			return fmt.Errorf("alpha: %w", err)
		}
		return reachable(ctx, inst, "beta")
	})

	// A creation condition turning false after creation changes nothing.
	putCluster("alpha", false)
	// A Secret rotation replaces the stored credentials.
	alpha, err := get("alpha")
	if err != nil {
		t.Fatal(err)
	}
	putSecret("alpha", append(append([]byte{}, w1.Kubeconfig...), []byte("\n# rotated\n")...))
	testkit.Eventually(t, 60*time.Second, func() error {
		c, err := get("alpha")
		if err != nil {
			return err
		}
		if c.Status.CredentialsFingerprint == alpha.Status.CredentialsFingerprint {
			return errors.New("alpha's credentials not rotated yet")
		}
		return reachable(ctx, inst, "alpha")
	})
	if c, err := get("alpha"); err != nil || c.Id != alpha.Id {
		t.Fatalf("alpha after its condition turned false: %v %v", c, err)
	}

	// A template change re-renders every lifecycle.
	before, err := lifecycles()
	if err != nil {
		t.Fatal(err)
	}
	policy.Template += "claims:\n  source: \"{{ .source.metadata.name }}\"\n"
	if _, err := pc.UpdateImportPolicy(ctx, connect.NewRequest(&clusterv1.UpdateImportPolicyRequest{Policy: policy})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		after, err := lifecycles()
		if err != nil {
			return err
		}
		for name, lc := range before {
			if !after[name].GetLastRenderTime().AsTime().After(lc.GetLastRenderTime().AsTime()) {
				return fmt.Errorf("%s not re-rendered", name)
			}
		}
		return nil
	})

	// Deleting the sources: alpha (created) is deregistered, beta (adopted) stays.
	for _, n := range []string{"alpha", "beta"} {
		if err := capi.Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Eventually(t, 60*time.Second, func() error {
		if _, err := get("alpha"); connect.CodeOf(err) != connect.CodeNotFound {
			return fmt.Errorf("alpha still registered (%v)", err)
		}
		beta, err := get("beta")
		if err != nil {
			return err
		}
		if len(beta.AdoptedBy) != 0 || beta.Labels["owner"] != "ops" {
			return fmt.Errorf("beta %v", beta)
		}
		return nil
	})
	select {
	case err := <-natsErrs:
		t.Errorf("the agent hit a NATS error (a permission it lacks?): %v", err)
	default:
	}
}
