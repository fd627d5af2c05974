package clusterimport_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// fakeInventory plays the inventory cluster's agent: it reports source objects on
// FLEET_AGENT and Secrets on core NATS, as services/cluster-agent does.
type fakeInventory struct {
	t       testing.TB
	j       *testkit.JetStream
	store   *events.Store
	cluster string
	// seq is the stream sequence of the last report appended.
	seq uint64
}

const capiGroup = "cluster.x-k8s.io"

func (f *fakeInventory) source(name string, ready bool, labels map[string]string, extra map[string]any) {
	f.t.Helper()
	status := "False"
	if ready {
		status = "True"
	}
	obj := map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
		"metadata": map[string]any{"name": name, "namespace": "capi", "labels": labels},
		"status":   map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": status}}},
	}
	for k, v := range extra {
		obj[k] = v
	}
	data, err := json.Marshal(obj)
	if err != nil {
		f.t.Fatal(err)
	}
	f.report(&agentv1.ImportObject{Name: name, Object: data})
}

func (f *fakeInventory) report(o *agentv1.ImportObject) {
	f.t.Helper()
	o.ClusterName, o.Group, o.Version, o.Resource, o.Namespace, o.SessionId = f.cluster, capiGroup, "v1beta1", "clusters", "capi", "s1"
	seq, err := f.store.Append(context.Background(), subjects.AgentImportObject(f.cluster, capiGroup, "clusters", "capi", o.Name), f.cluster, events.Any, o)
	if err != nil {
		f.t.Fatal(err)
	}
	f.seq = seq
}

func (f *fakeInventory) secret(name, kubeconfig string) {
	f.t.Helper()
	data, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": name, "namespace": "capi"},
		"data":     map[string]any{"value": base64.StdEncoding.EncodeToString([]byte(kubeconfig))}})
	msg, _ := proto.Marshal(&agentv1.ImportObject{ClusterName: f.cluster, Version: "v1", Resource: "secrets", Namespace: "capi", Name: name, Object: data, SessionId: "s1"})
	if err := f.j.Conn.Publish(subjects.AgentSecret(f.cluster, "capi", name), msg); err != nil {
		f.t.Fatal(err)
	}
}

func kubeconfigFor(server, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %s}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
users:
- name: u
  user: {token: %s}
`, server, token)
}

func lifecyclePolicy() *clusterv1.ImportPolicy {
	return &clusterv1.ImportPolicy{
		Name:   "capi",
		Source: &clusterv1.ImportSource{Cluster: "mgmt", Group: capiGroup, Version: "v1beta1", Resource: "clusters"},
		References: []*clusterv1.ImportReference{{Key: "kubeconfig", Version: "v1", Resource: "secrets",
			NamespaceTemplate: "{{ .source.metadata.namespace }}", NameTemplate: "{{ .source.metadata.name }}-kubeconfig"}},
		NameTemplate: "{{ .source.metadata.name }}",
		Template: `# {{ .source.spec.note }}
labels:
  provider: capi
  env: "{{ with .source.metadata.labels }}{{ .env }}{{ end }}"
credentials:
  kubeconfig: "{{ .references.kubeconfig.data.value }}"
`,
		CreationCondition: `{{ range .source.status.conditions }}{{ if and (eq .type "Ready") (eq .status "True") }}true{{ end }}{{ end }}`,
	}
}

type lifecycleWant struct {
	mode    clusterv1.ImportMode
	cluster string
	// reason of each condition type that must hold, e.g. Created → CreationConditionFalse.
	reasons map[string]string
}

func checkLifecycles(ctx context.Context, pc clusterv1connect.ImportPolicyServiceClient, want map[string]lifecycleWant) error {
	res, err := pc.ListImportLifecycles(ctx, connect.NewRequest(&clusterv1.ListImportLifecyclesRequest{Policy: "capi"}))
	if err != nil {
		return err
	}
	got := map[string]*clusterv1.ImportLifecycle{}
	for _, lc := range res.Msg.Lifecycles {
		got[lc.Source.Name] = lc
	}
	if len(got) != len(want) {
		return fmt.Errorf("lifecycles of %d sources, want %d: %v", len(got), len(want), res.Msg.Lifecycles)
	}
	for src, w := range want {
		lc := got[src]
		if lc == nil {
			return fmt.Errorf("no lifecycle for %s", src)
		}
		if lc.Mode != w.mode || lc.Cluster != w.cluster || lc.LastRenderTime == nil {
			return fmt.Errorf("%s: mode %v cluster %q, want %v %q (%v)", src, lc.Mode, lc.Cluster, w.mode, w.cluster, lc.Conditions)
		}
		for typ, reason := range w.reasons {
			found := false
			for _, c := range lc.Conditions {
				if c.Type == typ {
					found = true
					if c.Reason != reason {
						return fmt.Errorf("%s: %s is %s (%s), want %s", src, typ, c.Reason, c.Message, reason)
					}
				}
			}
			if !found {
				return fmt.Errorf("%s: no condition %s in %v", src, typ, lc.Conditions)
			}
		}
	}
	return nil
}

func eventsOn(ctx context.Context, t *testing.T, js jetstream.JetStream, subject string) []string {
	t.Helper()
	s, err := js.Stream(ctx, subjects.ClusterStream)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for range info.NumPending {
		m, err := c.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ev, err := events.Decode(m.Data())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.TrimPrefix(ev.Type, "fleetstream.cluster.v1."))
	}
	return out
}

func TestImportLifecycles(t *testing.T) {
	j := testkit.StartJetStream(t)
	ring := newRing(t, "k1")
	e := start(t, j, clusterimport.Config{Keyring: ring})
	ctx := testkit.Context(t, 3*time.Minute)
	pc := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	register(t, e, "mgmt", nil)
	register(t, e, "handmade", map[string]string{"owner": "ops"})
	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: lifecyclePolicy()})); err != nil {
		t.Fatal(err)
	}
	inv := &fakeInventory{t: t, j: j, store: events.NewStore(j.JS, "system:cluster-agent:mgmt"), cluster: "mgmt"}

	// The agent of mgmt is told to watch the source type, then each referenced Secret.
	watchKV, err := j.JS.KeyValue(ctx, subjects.ImportWatchBucket)
	if err != nil {
		t.Fatal(err)
	}
	watch := func() (*agentv1.ImportWatch, error) {
		e, err := watchKV.Get(ctx, subjects.ImportWatchKey("mgmt"))
		if err != nil {
			return nil, err
		}
		w := &agentv1.ImportWatch{}
		return w, proto.Unmarshal(e.Value(), w)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		w, err := watch()
		if err != nil {
			return err
		}
		if len(w.Sources) != 1 || w.Sources[0].Group != capiGroup || w.Sources[0].Resource != "clusters" {
			return fmt.Errorf("watch %v", w)
		}
		return nil
	})

	inv.source("alpha", true, map[string]string{"env": "prod"}, nil)
	inv.source("beta", false, nil, nil)
	inv.source("handmade", true, nil, nil)
	// Rendering it would write more than 64 KiB.
	inv.source("bloated", true, nil, map[string]any{"spec": map[string]any{"note": strings.Repeat("n", 70<<10)}})
	inv.report(&agentv1.ImportObject{Name: "huge", TooLarge: true})
	testkit.Eventually(t, 10*time.Second, func() error {
		w, err := watch()
		if err != nil {
			return err
		}
		if len(w.References) != 4 {
			return fmt.Errorf("references %v", w.References)
		}
		return nil
	})
	// Before the Secrets arrive nothing is created, and the lifecycles say why.
	testkit.Eventually(t, 10*time.Second, func() error {
		return checkLifecycles(ctx, pc, map[string]lifecycleWant{
			"alpha":    {reasons: map[string]string{"ReferencesResolved": "ReferenceNotFound", "Created": "NotRendered"}},
			"beta":     {reasons: map[string]string{"ReferencesResolved": "ReferenceNotFound"}},
			"handmade": {reasons: map[string]string{"ReferencesResolved": "ReferenceNotFound"}},
			"bloated":  {reasons: map[string]string{"ReferencesResolved": "ReferenceNotFound"}},
			"huge":     {reasons: map[string]string{"SourceValid": "SourceTooLarge"}},
		})
	})

	for _, n := range []string{"alpha", "beta", "handmade", "bloated"} {
		inv.secret(n+"-kubeconfig", kubeconfigFor("https://"+n+".example:6443", "token-of-"+n+"-0123456789"))
	}
	imported := map[string]lifecycleWant{
		"alpha":    {mode: clusterv1.ImportMode_IMPORT_MODE_CREATED, cluster: "alpha", reasons: map[string]string{"Rendered": "Rendered", "Created": "Created", "Adopted": "NotAdopted"}},
		"beta":     {reasons: map[string]string{"Rendered": "Rendered", "Created": "CreationConditionFalse"}},
		"handmade": {mode: clusterv1.ImportMode_IMPORT_MODE_ADOPTED, cluster: "handmade", reasons: map[string]string{"Created": "NotCreated", "Adopted": "Adopted"}},
		"bloated":  {reasons: map[string]string{"Rendered": "RenderTooLarge", "Created": "NotRendered"}},
		"huge":     {reasons: map[string]string{"SourceValid": "SourceTooLarge"}},
	}
	testkit.Eventually(t, 20*time.Second, func() error { return checkLifecycles(ctx, pc, imported) })

	// Renders are memoized: a pass with nothing new for a lifecycle (an unrelated cluster
	// registered, the same Secret resent) does not render it again.
	renderTimes := func() map[string]time.Time {
		res, err := pc.ListImportLifecycles(ctx, connect.NewRequest(&clusterv1.ListImportLifecyclesRequest{Policy: "capi"}))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]time.Time{}
		for _, lc := range res.Msg.Lifecycles {
			out[lc.Source.Name] = lc.LastRenderTime.AsTime()
		}
		return out
	}
	rendered := renderTimes()
	// Every Secret sent so far is taken (the lifecycles above show them): one more is to come.
	secrets := e.svc.SecretReports() + 1
	inv.secret("alpha-kubeconfig", kubeconfigFor("https://alpha.example:6443", "token-of-alpha-0123456789"))
	register(t, e, "unrelated", nil)
	if err := e.svc.WaitImportPass(ctx, inv.seq, secrets); err != nil {
		t.Fatal(err)
	}
	if again := renderTimes(); fmt.Sprint(again) != fmt.Sprint(rendered) {
		t.Errorf("re-rendered without a change:\n%v\n%v", again, rendered)
	}
	if _, err := e.client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "unrelated"})); err != nil {
		t.Fatal(err)
	}

	get := func(name string) (*clusterv1.Cluster, error) {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: name}))
		if err != nil {
			return nil, err
		}
		return res.Msg.Cluster, nil
	}
	alpha, err := get("alpha")
	if err != nil {
		t.Fatal(err)
	}
	if alpha.Labels["provider"] != "capi" || alpha.Labels["env"] != "prod" || alpha.ImportedBy.GetPolicy() != "capi" || alpha.ImportedBy.GetSource().GetName() != "alpha" {
		t.Errorf("alpha: %v", alpha)
	}
	creds, err := e.svc.Credentials(ctx, "alpha")
	if err != nil || !strings.Contains(string(creds.GetKubeconfig()), "token-of-alpha-0123456789") {
		t.Errorf("alpha's credentials: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		hm, err := get("handmade")
		if err != nil {
			return err
		}
		if hm.Labels["owner"] != "ops" || hm.Labels["provider"] != "" || len(hm.AdoptedBy) != 1 || hm.ImportedBy != nil || !hm.Status.CredentialsSet {
			return fmt.Errorf("handmade: %v", hm)
		}
		return nil
	})
	for _, tc := range []struct {
		subject string
		want    string
	}{
		{subjects.Cluster("alpha"), "ClusterRegistered ClusterImported"},
		{subjects.Cluster("handmade"), "ClusterRegistered ClusterAdopted ClusterCredentialsRotated"},
	} {
		if got := strings.Join(eventsOn(ctx, t, j.JS, tc.subject), " "); got != tc.want {
			t.Errorf("events on %s: %s, want %s", tc.subject, got, tc.want)
		}
	}

	// Restart: the Secrets are gone with the old process until the agent resends them;
	// nothing is removed meanwhile, and then everything is as before, with no new event.
	e.stop()
	e = start(t, j, clusterimport.Config{Keyring: ring})
	pc = clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	testkit.Eventually(t, 10*time.Second, func() error {
		return checkLifecycles(ctx, pc, map[string]lifecycleWant{
			"alpha":    {mode: clusterv1.ImportMode_IMPORT_MODE_CREATED, cluster: "alpha", reasons: map[string]string{"ReferencesResolved": "ReferenceNotFound", "Created": "Created"}},
			"beta":     {reasons: map[string]string{"ReferencesResolved": "ReferenceNotFound"}},
			"handmade": {mode: clusterv1.ImportMode_IMPORT_MODE_ADOPTED, cluster: "handmade", reasons: map[string]string{"Adopted": "Adopted"}},
			"bloated":  {reasons: map[string]string{"ReferencesResolved": "ReferenceNotFound"}},
			"huge":     {reasons: map[string]string{"SourceValid": "SourceTooLarge"}},
		})
	})
	for _, n := range []string{"alpha", "beta", "handmade", "bloated"} {
		inv.secret(n+"-kubeconfig", kubeconfigFor("https://"+n+".example:6443", "token-of-"+n+"-0123456789"))
	}
	testkit.Eventually(t, 20*time.Second, func() error { return checkLifecycles(ctx, pc, imported) })
	if got := strings.Join(eventsOn(ctx, t, j.JS, subjects.Cluster("alpha")), " "); got != "ClusterRegistered ClusterImported" {
		t.Errorf("events on alpha after restart: %s", got)
	}

	// beta becomes ready: created; not ready again: changes nothing.
	inv.source("beta", true, nil, nil)
	imported["beta"] = lifecycleWant{mode: clusterv1.ImportMode_IMPORT_MODE_CREATED, cluster: "beta", reasons: map[string]string{"Created": "Created"}}
	testkit.Eventually(t, 20*time.Second, func() error { return checkLifecycles(ctx, pc, imported) })
	inv.source("beta", false, nil, nil)
	if err := e.svc.WaitImportPass(ctx, inv.seq, 0); err != nil {
		t.Fatal(err)
	}
	if err := checkLifecycles(ctx, pc, imported); err != nil {
		t.Fatalf("after beta's condition turned false: %v", err)
	}

	// A rotated Secret rotates the stored credentials.
	before := alpha.Status.CredentialsFingerprint
	inv.secret("alpha-kubeconfig", kubeconfigFor("https://alpha.example:6443", "rotated-token-of-alpha-987654"))
	testkit.Eventually(t, 20*time.Second, func() error {
		c, err := get("alpha")
		if err != nil {
			return err
		}
		if c.Status.CredentialsFingerprint == before {
			return errors.New("credentials not rotated yet")
		}
		return nil
	})
	if creds, err := e.svc.Credentials(ctx, "alpha"); err != nil || !strings.Contains(string(creds.GetKubeconfig()), "rotated-token-of-alpha") {
		t.Errorf("alpha's rotated credentials: %v", err)
	}

	// Source deletions: a created cluster goes, an adopted one stays with its labels.
	inv.report(&agentv1.ImportObject{Name: "alpha", Deleted: true})
	inv.report(&agentv1.ImportObject{Name: "handmade", Deleted: true})
	delete(imported, "alpha")
	delete(imported, "handmade")
	testkit.Eventually(t, 20*time.Second, func() error {
		if err := checkLifecycles(ctx, pc, imported); err != nil {
			return err
		}
		if _, err := get("alpha"); connect.CodeOf(err) != connect.CodeNotFound {
			return fmt.Errorf("alpha still registered: %v", err)
		}
		hm, err := get("handmade")
		if err != nil {
			return err
		}
		if len(hm.AdoptedBy) != 0 || hm.Labels["owner"] != "ops" {
			return fmt.Errorf("handmade: %v", hm)
		}
		return nil
	})
	if got := strings.Join(eventsOn(ctx, t, j.JS, subjects.Cluster("alpha")), " "); got != "ClusterRegistered ClusterImported ClusterCredentialsRotated ImportedClusterRemoved ClusterDeregistered" {
		t.Errorf("events on alpha: %s", got)
	}

	// A changed name template is a new lifecycle: beta's cluster goes, capi-beta comes.
	pol := lifecyclePolicy()
	pol.NameTemplate = "capi-{{ .source.metadata.name }}"
	pol.CreationCondition = "true"
	if _, err := pc.UpdateImportPolicy(ctx, connect.NewRequest(&clusterv1.UpdateImportPolicyRequest{Policy: pol})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		if _, err := get("beta"); connect.CodeOf(err) != connect.CodeNotFound {
			return fmt.Errorf("beta still registered: %v", err)
		}
		c, err := get("capi-beta")
		if err != nil {
			return err
		}
		if c.ImportedBy.GetSource().GetName() != "beta" {
			return fmt.Errorf("capi-beta: %v", c)
		}
		return nil
	})

	// Deleting the policy ends every lifecycle.
	if _, err := pc.DeleteImportPolicy(ctx, connect.NewRequest(&clusterv1.DeleteImportPolicyRequest{Name: "capi"})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		res, err := e.client.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
		if err != nil {
			return err
		}
		var names []string
		for _, c := range res.Msg.Clusters {
			names = append(names, c.Name)
		}
		if strings.Join(names, ",") != "handmade,mgmt" {
			return fmt.Errorf("clusters %v", names)
		}
		return nil
	})
}
