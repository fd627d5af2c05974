package desired_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/protectedns"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
)

const (
	cluster      = "member-1"
	projectLabel = "fleetstream.io/project"
	nsBucket     = subjects.DesiredNamespacesBucket
	rbacBucket   = subjects.DesiredRBACBucket
	waitFor      = 30 * time.Second
)

// env is one member cluster (a real kube-apiserver) and one hub (a real JetStream).
type env struct {
	ctx     context.Context
	nats    *testkit.JetStream
	kube    *testkit.Kube
	dyn     dynamic.Interface
	buckets map[string]jetstream.KeyValue
	applied jetstream.KeyValue
	// log is the applier's logger (default testkit.Logger).
	log *zap.Logger
	// protected is the applier's Config.Protected.
	protected protectedns.List
}

func newEnv(t *testing.T, createBuckets bool) *env {
	t.Helper()
	e := &env{ctx: testkit.Context(t, 3*time.Minute), nats: testkit.StartJetStream(t), kube: testkit.StartKube(t), buckets: map[string]jetstream.KeyValue{}}
	dyn, err := dynamic.NewForConfig(e.kube.Config)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	e.dyn = dyn
	if createBuckets {
		e.createBuckets(t)
	}
	return e
}

// createBuckets creates what namespace-binding, rbac-sync and the status owner create in
// production.
func (e *env) createBuckets(t *testing.T) {
	t.Helper()
	for _, b := range append(subjects.DesiredBuckets(), subjects.AppliedBucket) {
		cfg := subjects.FeedBucketConfig(b, "")
		if b == subjects.AppliedBucket {
			cfg = subjects.AppliedBucketConfig(1)
		}
		kv, err := e.nats.JS.CreateKeyValue(e.ctx, cfg)
		if err != nil {
			t.Fatalf("create bucket %s: %v", b, err)
		}
		if b == subjects.AppliedBucket {
			e.applied = kv
		} else {
			e.buckets[b] = kv
		}
	}
}

// start runs an applier until the returned stop is called (or the test ends).
func (e *env) start(t *testing.T) (stop func()) {
	t.Helper()
	log := e.log
	if log == nil {
		log = testkit.Logger(t)
	}
	a, err := desired.New(desired.Config{ClusterName: cluster, Workers: 3, ResyncPeriod: time.Minute, Protected: e.protected}, e.nats.JS, e.dyn, e.kube.Client.Discovery(), log)
	if err != nil {
		t.Fatalf("new applier: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("applier run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("applier did not stop")
		}
	}
	t.Cleanup(stop)
	return stop
}

// desiredObj is one desired entry to write.
type desiredObj struct {
	bucket, kind, namespace, name string
	obj                           *desiredv1.DesiredObject
}

func (d desiredObj) key() string { return subjects.DesiredKey(cluster, d.kind, d.namespace, d.name) }

// put writes d and returns its KV revision.
func (e *env) put(t *testing.T, d desiredObj) uint64 {
	t.Helper()
	data, err := proto.Marshal(d.obj)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := e.buckets[d.bucket].Put(e.ctx, d.key(), data)
	if err != nil {
		t.Fatalf("put %s: %v", d.key(), err)
	}
	return rev
}

func (e *env) del(t *testing.T, d desiredObj) {
	t.Helper()
	if err := e.buckets[d.bucket].Delete(e.ctx, d.key()); err != nil {
		t.Fatalf("delete %s: %v", d.key(), err)
	}
}

// status returns the applied status of d (nil when there is none).
func (e *env) status(d desiredObj) (*desiredv1.AppliedStatus, error) {
	ent, err := e.applied.Get(e.ctx, subjects.AppliedKey(d.bucket, d.key()))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	st := &desiredv1.AppliedStatus{}
	return st, proto.Unmarshal(ent.Value(), st)
}

// waitStatus waits until d's status is phase/reason for revision rev (any revision when 0).
func (e *env) waitStatus(t *testing.T, d desiredObj, rev uint64, phase desiredv1.Phase, reason string) *desiredv1.AppliedStatus {
	t.Helper()
	var st *desiredv1.AppliedStatus
	testkit.Eventually(t, waitFor, func() error {
		var err error
		st, err = e.status(d)
		switch {
		case err != nil:
			return err
		case st == nil:
			return fmt.Errorf("no status for %s", d.key())
		case rev != 0 && st.DesiredRevision != rev, st.Phase != phase, st.Reason != reason:
			return fmt.Errorf("status of %s: %v, want revision %d %v %s", d.key(), st, rev, phase, reason)
		}
		return nil
	})
	return st
}

func namespaceObj(name, project string, policy desiredv1.DeletionPolicy) desiredObj {
	m := map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": name, "labels": map[string]any{projectLabel: project, "team": "t-" + project}},
	}
	return desiredObj{bucket: nsBucket, kind: "Namespace", name: name, obj: &desiredv1.DesiredObject{
		Manifest: mustJSON(m), OwnerLabelKey: projectLabel, OwnerLabelValue: project, Owner: "namespace-binding", DeletionPolicy: policy,
	}}
}

func quotaObj(namespace, name, pods string) desiredObj {
	m := map[string]any{
		"apiVersion": "v1", "kind": "ResourceQuota",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"spec":     map[string]any{"hard": map[string]any{"pods": pods, "requests.cpu": "2"}},
	}
	return desiredObj{bucket: nsBucket, kind: "ResourceQuota", namespace: namespace, name: name, obj: &desiredv1.DesiredObject{
		Manifest: mustJSON(m), Owner: "namespace-binding", ReportStatus: true,
	}}
}

func clusterRoleObj(name string) desiredObj {
	m := map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": name},
		"rules":    []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}, "verbs": []any{"get", "list"}}},
	}
	return desiredObj{bucket: rbacBucket, kind: "ClusterRole", name: name, obj: &desiredv1.DesiredObject{Manifest: mustJSON(m), Owner: "rbac-sync"}}
}

// roleBindingObj binds ClusterRole role to user in namespace, as rbac-sync's desired
// RoleBindings of a project do.
func roleBindingObj(namespace, name, role, user string) desiredObj {
	m := map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}},
	}
	return desiredObj{bucket: rbacBucket, kind: "RoleBinding", namespace: namespace, name: name, obj: &desiredv1.DesiredObject{Manifest: mustJSON(m), Owner: "rbac-sync"}}
}

// tombstone returns d's tombstone with policy.
func tombstone(d desiredObj, policy desiredv1.DeletionPolicy) desiredObj {
	d.obj = &desiredv1.DesiredObject{Tombstone: true, DeletionPolicy: policy, OwnerLabelKey: d.obj.OwnerLabelKey, OwnerLabelValue: d.obj.OwnerLabelValue, Owner: d.obj.Owner}
	return d
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// managedNamespace checks ns carries our marks for d and the project label.
func (e *env) managedNamespace(d desiredObj, project string) func() error {
	return func() error {
		ns, err := e.kube.Client.CoreV1().Namespaces().Get(e.ctx, d.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ns.DeletionTimestamp != nil {
			return fmt.Errorf("namespace %s is terminating", d.name)
		}
		return checkMarks(ns.ObjectMeta, d, map[string]string{projectLabel: project})
	}
}

func checkMarks(m metav1.ObjectMeta, d desiredObj, labels map[string]string) error {
	if m.Labels[desired.ManagedByLabel] != desired.ManagedByValue {
		return fmt.Errorf("%s labels %v lack managed-by", m.Name, m.Labels)
	}
	for k, v := range labels {
		if m.Labels[k] != v {
			return fmt.Errorf("%s labels %v lack %s=%s", m.Name, m.Labels, k, v)
		}
	}
	if want := d.bucket + "/" + d.key(); m.Annotations[desired.DesiredKeyAnnotation] != want {
		return fmt.Errorf("%s annotations %v, want desired key %s", m.Name, m.Annotations, want)
	}
	return nil
}

// unmanaged checks ns exists without any of our marks or the project label.
func (e *env) unmanagedNamespace(name string) func() error {
	return func() error {
		ns, err := e.kube.Client.CoreV1().Namespaces().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ns.DeletionTimestamp != nil {
			return fmt.Errorf("namespace %s is terminating", name)
		}
		if _, ok := ns.Labels[desired.ManagedByLabel]; ok {
			return fmt.Errorf("%s still labelled %v", name, ns.Labels)
		}
		if _, ok := ns.Labels[projectLabel]; ok {
			return fmt.Errorf("%s still labelled %v", name, ns.Labels)
		}
		if _, ok := ns.Annotations[desired.DesiredKeyAnnotation]; ok {
			return fmt.Errorf("%s still annotated %v", name, ns.Annotations)
		}
		return nil
	}
}

// finalize removes a terminating namespace for good: there is no controller-manager in the
// test cluster to empty it and drop its finalizer.
func (e *env) finalize(t *testing.T, name string) {
	t.Helper()
	testkit.Eventually(t, waitFor, func() error {
		ns, err := e.kube.Client.CoreV1().Namespaces().Get(e.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if ns.DeletionTimestamp == nil {
			return fmt.Errorf("namespace %s not terminating", name)
		}
		ns.Spec.Finalizers = nil
		_, err = e.kube.Client.CoreV1().Namespaces().Finalize(e.ctx, ns, metav1.UpdateOptions{})
		return err
	})
}

func (e *env) createNamespace(t *testing.T, name string, labels map[string]string) *corev1.Namespace {
	t.Helper()
	ns, err := e.kube.Client.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return ns
}
