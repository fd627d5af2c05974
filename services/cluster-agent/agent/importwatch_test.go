package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
)

var capiClusters = schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters"}

func capiCluster(name string, labels map[string]string, annotations map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cluster.x-k8s.io/v1beta1",
		"kind":       "Cluster",
		"metadata":   map[string]any{"name": name, "namespace": "capi"},
		"spec":       map[string]any{"controlPlaneEndpoint": map[string]any{"host": name + ".example", "port": int64(6443)}},
	}}
	u.SetLabels(labels)
	u.SetAnnotations(annotations)
	return u
}

// runImportAgent runs an agent with an ImportWatcher until stop is called.
func runImportAgent(t *testing.T, js jetstream.JetStream, k *testkit.Kube, log *zap.Logger, cfg agent.ImportWatchConfig) (stop func()) {
	t.Helper()
	a, err := agent.New(agent.Config{ClusterName: cluster, HeartbeatInterval: time.Hour}, js, k.Client, log)
	if err != nil {
		t.Fatalf("new agent: %v", err)
	}
	dyn, err := dynamic.NewForConfig(k.Config)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	a.Add(agent.NewImportWatcher(a, dyn, k.Client.Discovery(), cfg))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("agent run: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("agent did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

type importReport struct {
	seq uint64
	obj *agentv1.ImportObject
}

func lastImportObject(ctx context.Context, js jetstream.JetStream, name string) (importReport, error) {
	r, err := latest[*agentv1.ImportObject](ctx, js, subjects.AgentImportObject(cluster, "cluster.x-k8s.io", "clusters", "capi", name))
	return importReport{seq: r.seq, obj: r.payload}, err
}

func lastSync(ctx context.Context, js jetstream.JetStream) (report[*agentv1.ImportSync], error) {
	return latest[*agentv1.ImportSync](ctx, js, subjects.AgentImportSync(cluster, "cluster.x-k8s.io", "clusters", ""))
}

// secretInbox collects the Secrets the agent sends on core NATS, latest per name.
type secretInbox struct {
	mu   sync.Mutex
	last map[string]*agentv1.ImportObject
	n    map[string]int
}

func (s *secretInbox) get(name string) (*agentv1.ImportObject, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[name], s.n[name]
}

func TestImportWatcher(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 3*time.Minute)
	ensureStream(t, ctx, j.JS)
	k.InstallCRD(t, testkit.CAPIClusterCRD)
	dyn, err := dynamic.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	clusters := dyn.Resource(capiClusters).Namespace("capi")
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "capi"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*unstructured.Unstructured{
		capiCluster("alpha", map[string]string{"env": "prod"}, nil),
		capiCluster("beta", nil, nil),
		// Bigger than the agent's bound below: reported as too large, never in full.
		capiCluster("huge", nil, map[string]string{"filler": strings.Repeat("x", 6000)}),
	} {
		if _, err := clusters.Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create cluster %s: %v", c.GetName(), err)
		}
	}
	const secretValue = "c2VjcmV0LWt1YmVjb25maWctZm9yLWFscGhh" // must never reach a log or a stream
	if _, err := k.Client.CoreV1().Secrets("capi").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "alpha-kubeconfig", Namespace: "capi"},
		Data:       map[string][]byte{"value": []byte(secretValue)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// What the hub would write: the source type and two referenced Secrets, one missing.
	kv, err := j.JS.CreateKeyValue(ctx, subjects.FeedBucketConfig(subjects.ImportWatchBucket, ""))
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := proto.Marshal(&agentv1.ImportWatch{
		Sources: []*agentv1.WatchedType{{Group: "cluster.x-k8s.io", Resource: "clusters"}},
		References: []*agentv1.WatchedObject{
			{Version: "v1", Resource: "secrets", Namespace: "capi", Name: "alpha-kubeconfig"},
			{Version: "v1", Resource: "secrets", Namespace: "capi", Name: "beta-kubeconfig"},
			// Of the source type: its informer reports it, no second one is started.
			{Group: "cluster.x-k8s.io", Resource: "clusters", Namespace: "capi", Name: "beta"},
		},
	})
	if _, err := kv.Put(ctx, subjects.ImportWatchKey(cluster), spec); err != nil {
		t.Fatal(err)
	}

	inbox := &secretInbox{last: map[string]*agentv1.ImportObject{}, n: map[string]int{}}
	sub, err := j.Conn.Subscribe(subjects.AgentSecretPrefix+".>", func(m *nats.Msg) {
		o := &agentv1.ImportObject{}
		if err := proto.Unmarshal(m.Data, o); err != nil {
			t.Errorf("secret report: %v", err)
			return
		}
		if m.Subject != subjects.AgentSecret(cluster, o.Namespace, o.Name) {
			t.Errorf("secret %s on subject %s", o.Name, m.Subject)
		}
		inbox.mu.Lock()
		inbox.last[o.Name] = o
		inbox.n[o.Name]++
		inbox.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(zapcore.NewTee(core, testkit.Logger(t).Core()))
	stop := runImportAgent(t, j.JS, k, log, agent.ImportWatchConfig{SecretResend: 300 * time.Millisecond, MaxObjectBytes: 4000})

	// Every source object, then the marker after them.
	var marker report[*agentv1.ImportSync]
	testkit.Eventually(t, 30*time.Second, func() error {
		marker, err = lastSync(ctx, j.JS)
		return err
	})
	for _, tc := range []struct {
		name     string
		tooLarge bool
		label    string
	}{
		{"alpha", false, "prod"},
		{"beta", false, ""},
		{"huge", true, ""},
	} {
		r, err := lastImportObject(ctx, j.JS, tc.name)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.seq > marker.seq {
			t.Errorf("%s reported after the sync marker (%d > %d)", tc.name, r.seq, marker.seq)
		}
		if r.obj.TooLarge != tc.tooLarge || r.obj.Deleted || r.obj.SessionId != marker.payload.SessionId {
			t.Errorf("%s: too_large=%v deleted=%v session=%s (marker %s)", tc.name, r.obj.TooLarge, r.obj.Deleted, r.obj.SessionId, marker.payload.SessionId)
		}
		if tc.tooLarge {
			if len(r.obj.Object) != 0 {
				t.Errorf("%s: too large object sent anyway (%d bytes)", tc.name, len(r.obj.Object))
			}
			continue
		}
		var u unstructured.Unstructured
		if err := json.Unmarshal(r.obj.Object, &u.Object); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if u.GetName() != tc.name || u.GetLabels()["env"] != tc.label || u.GetManagedFields() != nil || r.obj.Version != "v1beta1" {
			t.Errorf("%s: reported %s labels %v version %s managedFields %d", tc.name, u.GetName(), u.GetLabels(), r.obj.Version, len(u.GetManagedFields()))
		}
	}
	if n := logs.FilterMessage("watching import objects").FilterField(zap.Bool("source", false)).Len(); n != 1 {
		t.Errorf("%d reference informers started, want 1 (Secrets in capi)", n)
	}
	if logs.FilterMessage("import object too large to report").Len() != 1 {
		t.Errorf("want one log for the too large object, got %d", logs.FilterMessage("import object too large to report").Len())
	}

	// Secrets: on core NATS only, repeated, the missing one as deleted.
	testkit.Eventually(t, 20*time.Second, func() error {
		a, na := inbox.get("alpha-kubeconfig")
		b, _ := inbox.get("beta-kubeconfig")
		if a == nil || b == nil || na < 2 {
			return fmt.Errorf("secrets so far: alpha %d", na)
		}
		if !strings.Contains(string(a.Object), secretValue) && !strings.Contains(string(a.Object), "YzJWamNtVjBMV3QxWW1WamIyNW1hV2N0Wm05eUxXRnNjR2ho") {
			return fmt.Errorf("alpha's data missing")
		}
		if !b.Deleted || len(b.Object) != 0 {
			return fmt.Errorf("beta-kubeconfig should be reported missing: %v", b)
		}
		return nil
	})
	si, err := j.JS.Stream(ctx, subjects.AgentStreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := si.Info(ctx, jetstream.WithSubjectFilter(subjects.AgentPrefix+".>"))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range info.State.Subjects {
		if strings.Contains(subj, "secrets") {
			t.Errorf("a Secret reached the stream on %s", subj)
		}
	}

	// Changes and deletions follow.
	u, err := clusters.Get(ctx, "alpha", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.SetLabels(map[string]string{"env": "staging"})
	if _, err := clusters.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := clusters.Delete(ctx, "beta", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		a, err := lastImportObject(ctx, j.JS, "alpha")
		if err != nil {
			return err
		}
		if !strings.Contains(string(a.obj.Object), `"staging"`) {
			return fmt.Errorf("alpha's label change not reported")
		}
		b, err := lastImportObject(ctx, j.JS, "beta")
		if err != nil {
			return err
		}
		if !b.obj.Deleted {
			return fmt.Errorf("beta's deletion not reported")
		}
		return nil
	})

	// Deleted while no agent runs: the next run's marker supersedes the old report.
	stop()
	if err := clusters.Delete(ctx, "alpha", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	runImportAgent(t, j.JS, k, log, agent.ImportWatchConfig{SecretResend: time.Hour})
	testkit.Eventually(t, 30*time.Second, func() error {
		m, err := lastSync(ctx, j.JS)
		if err != nil {
			return err
		}
		if m.payload.SessionId == marker.payload.SessionId {
			return fmt.Errorf("no marker from the new run yet")
		}
		a, err := lastImportObject(ctx, j.JS, "alpha")
		if err != nil {
			return err
		}
		if a.obj.Deleted || a.seq > m.seq || a.obj.SessionId == m.payload.SessionId {
			return fmt.Errorf("alpha: want its old report, older than the new marker: %+v seq %d marker %d", a.obj, a.seq, m.seq)
		}
		return nil
	})

	for _, e := range logs.All() {
		line := e.Message + fmt.Sprint(e.ContextMap())
		if strings.Contains(line, secretValue) {
			t.Errorf("secret data logged: %s", e.Message)
		}
	}
}
