package fleetd_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
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
	"github.com/fleetstream/fleetstream/pkg/subjects"
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
// cluster-import into clusters whose stored credentials reach two other real apiservers, where
// hosted agents then apply a project's namespace and roles.
func TestImportPolicyImportsClusterAPIClusters(t *testing.T) {
	inst, client := startFleetd(t, withHostedAgents)
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
	ag := startAgent(t, ctx, inst, "mgmt", reg.Msg.AgentToken, func(js jetstream.JetStream) (agentRunner, error) {
		a, err := agent.New(agent.Config{ClusterName: "mgmt", HeartbeatInterval: time.Second}, js, inv.Client, testkit.Logger(t))
		if err != nil {
			return nil, err
		}
		a.Add(agent.NewImportWatcher(a, dyn, inv.Client.Discovery(), agent.ImportWatchConfig{SecretResend: time.Second}))
		return a, nil
	})

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

	// Hosted agents connect both imported clusters and apply what the hub decides there: a
	// project's namespace and its member's role (checked with each cluster's own authorizer).
	testkit.Eventually(t, 60*time.Second, func() error {
		if got := inst.Hosted.Hosting(); !slices.Equal(got, []string{"alpha", "beta"}) {
			return fmt.Errorf("hosting %v", got)
		}
		if err := hostedConnected(ctx, client, "alpha", true); err != nil {
			return err
		}
		return hostedConnected(ctx, client, "beta", true)
	})
	grantOnClusters(t, ctx, inst, "alpha", "beta")
	testkit.Eventually(t, 60*time.Second, func() error {
		for name, kube := range map[string]*testkit.Kube{"alpha": w1, "beta": w2} {
			if ok, err := canI(ctx, kube.Client, "alice", "web"); err != nil || !ok {
				return fmt.Errorf("alice may not create deployments in web on %s (%v)", name, err)
			}
			if ok, err := canI(ctx, kube.Client, "mallory", "web"); err != nil || ok {
				return fmt.Errorf("mallory may create deployments in web on %s (%v)", name, err)
			}
		}
		return nil
	})
	alphaAgent, err := agentStatus(ctx, inst, "alpha")
	if err != nil {
		t.Fatal(err)
	}

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
	// The hosted agent reconnected with the rotated credentials: a new session heartbeats.
	testkit.Eventually(t, 30*time.Second, func() error {
		st, err := agentStatus(ctx, inst, "alpha")
		if err != nil {
			return err
		}
		if st.SessionId == alphaAgent.SessionId || !st.Hosted {
			return fmt.Errorf("alpha's hosted agent did not reconnect (session %s, hosted %v)", st.SessionId, st.Hosted)
		}
		return nil
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

	// Deleting the sources: alpha (created) is deregistered, beta (adopted) stays, without the
	// credentials its import attached (docs/import.md, "Adoption and credentials").
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
		if len(beta.AdoptedBy) != 0 || beta.Labels["owner"] != "ops" || beta.Status.CredentialsSet {
			return fmt.Errorf("beta %v", beta)
		}
		// alpha's hosted agent stopped with its cluster, beta's with its credentials.
		if got := inst.Hosted.Hosting(); len(got) != 0 {
			return fmt.Errorf("hosting %v", got)
		}
		return nil
	})
	select {
	case err := <-ag.NATSErrors:
		t.Errorf("the agent hit a NATS error (a permission it lacks?): %v", err)
	default:
	}
}

// Against the real server: an agent reads only its own import watch and sends Secrets only as
// itself, and no agent receives them.
func TestAgentImportWatchAndSecretsAreConfined(t *testing.T) {
	inst, client := startFleetd(t)
	ctx := testkit.Context(t, 60*time.Second)
	reg, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	kvHub, err := inst.JS.KeyValue(ctx, subjects.ImportWatchBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"c1", "c2"} {
		if _, err := kvHub.Put(ctx, subjects.ImportWatchKey(c), []byte("spec of "+c)); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, 16)
	nc, err := connectAgent(inst, "c1", reg.Msg.AgentToken, errs)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, subjects.ImportWatchBucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, subjects.ImportWatchKey("c1"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-w.Updates():
		if e == nil || string(e.Value()) != "spec of c1" {
			t.Fatalf("own watch: %v", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("own import watch not read")
	}
	_ = w.Stop()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if w2, err := kv.Watch(wctx, subjects.ImportWatchKey("c2")); err == nil {
		select {
		case e := <-w2.Updates():
			if e != nil {
				t.Fatalf("read c2's import watch: %s", e.Value())
			}
		case <-wctx.Done():
		}
	}

	seen := make(chan string, 16)
	sub, err := inst.Conn.Subscribe(subjects.AgentSecretPrefix+".>", func(m *nats.Msg) { seen <- m.Subject })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = inst.Conn.Flush()
	if _, err := nc.Subscribe(subjects.AgentSecretPrefix+".>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(subjects.AgentSecret("c2", "capi", "x-kubeconfig"), []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(subjects.AgentSecret("c1", "capi", "x-kubeconfig"), []byte("own")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case s := <-seen:
		if s != subjects.AgentSecret("c1", "capi", "x-kubeconfig") {
			t.Fatalf("secret on %s got through", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("own secret did not arrive")
	}
	select {
	case s := <-seen:
		t.Fatalf("secret on %s got through", s)
	case <-time.After(300 * time.Millisecond):
	}
	violations := 0
	for done := false; !done; {
		select {
		case err := <-errs:
			if strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				violations++
			}
		case <-time.After(time.Second):
			done = true
		}
	}
	// The subscription, the forged Secret and the consumer on c2's key.
	if violations < 2 {
		t.Errorf("%d permission violations reported, want at least 2", violations)
	}
}
