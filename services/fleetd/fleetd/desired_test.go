package fleetd_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// openOrCreateBucket opens bucket with fleetd's own connection, creating it the way its owner
// service will if that service is not running in fleetd yet.
func openOrCreateBucket(t *testing.T, ctx context.Context, inst *fleetd.Instance, bucket string) jetstream.KeyValue {
	t.Helper()
	kv, err := inst.JS.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = inst.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1})
	}
	if err != nil {
		t.Fatalf("bucket %s: %v", bucket, err)
	}
	return kv
}

func namespaceManifest(name string) []byte {
	return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":%q}}`, name)
}

// An agent's restricted NATS credentials suffice to run the desired applier (watch its own
// desired keys, read and write its own applied statuses) and reach nothing of another cluster.
func TestAgentAppliesDesiredStateWithItsCredentials(t *testing.T) {
	inst, client := startFleetd(t)
	kube := testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	reg, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c2"})); err != nil {
		t.Fatal(err)
	}
	nsKV := openOrCreateBucket(t, ctx, inst, subjects.DesiredNamespacesBucket)
	rbacKV := openOrCreateBucket(t, ctx, inst, subjects.DesiredRBACBucket)
	appliedKV := openOrCreateBucket(t, ctx, inst, subjects.AppliedBucket)

	put := func(kv jetstream.KeyValue, key string, obj *desiredv1.DesiredObject) uint64 {
		t.Helper()
		data, err := proto.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		rev, err := kv.Put(ctx, key, data)
		if err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
		return rev
	}
	ownNS := subjects.DesiredKey("c1", "Namespace", "", "web")
	ownNSRev := put(nsKV, ownNS, &desiredv1.DesiredObject{Manifest: namespaceManifest("web")})
	ownRole := subjects.DesiredKey("c1", "ClusterRole", "", "fleet:viewer")
	ownRoleRev := put(rbacKV, ownRole, &desiredv1.DesiredObject{Manifest: []byte(
		`{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"fleet:viewer"},"rules":[{"apiGroups":[""],"resources":["pods"],"verbs":["get"]}]}`)})
	otherNS := subjects.DesiredKey("c2", "Namespace", "", "secret")
	put(nsKV, otherNS, &desiredv1.DesiredObject{Manifest: namespaceManifest("secret")})

	errs := make(chan error, 64)
	nc, err := connectAgent(inst, "c1", reg.Msg.AgentToken, errs)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	applier, err := desired.New(desired.Config{ClusterName: "c1"}, js, dyn, kube.Client.Discovery(), testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	actx, stopApplier := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- applier.Run(actx) }()
	defer func() {
		stopApplier()
		if err := <-done; err != nil {
			t.Errorf("applier: %v", err)
		}
	}()

	// The applier, on the agent's connection, applied its cluster's objects of both buckets and
	// reported them.
	statusOf := func(bucket, key string) (*desiredv1.AppliedStatus, error) {
		e, err := appliedKV.Get(ctx, subjects.AppliedKey(bucket, key))
		if err != nil {
			return nil, fmt.Errorf("status of %s: %w", key, err)
		}
		st := &desiredv1.AppliedStatus{}
		return st, proto.Unmarshal(e.Value(), st)
	}
	for _, w := range []struct {
		bucket, key string
		rev         uint64
	}{{subjects.DesiredNamespacesBucket, ownNS, ownNSRev}, {subjects.DesiredRBACBucket, ownRole, ownRoleRev}} {
		testkit.Eventually(t, 60*time.Second, func() error {
			st, err := statusOf(w.bucket, w.key)
			if err != nil {
				return err
			}
			if st.Phase != desiredv1.Phase_PHASE_APPLIED || st.DesiredRevision != w.rev {
				return fmt.Errorf("status of %s: %v", w.key, st)
			}
			return nil
		})
	}
	if _, err := kube.Client.CoreV1().Namespaces().Get(ctx, "web", metav1.GetOptions{}); err != nil {
		t.Errorf("own namespace: %v", err)
	}
	if _, err := kube.Client.RbacV1().ClusterRoles().Get(ctx, "fleet:viewer", metav1.GetOptions{}); err != nil {
		t.Errorf("own cluster role: %v", err)
	}
	if _, err := kube.Client.CoreV1().Namespaces().Get(ctx, "secret", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("c2's namespace on c1: %v, want not found", err)
	}

	// What the agent may do directly, and what it may not: each denied call times out (the
	// server drops a forbidden publish), so each gets a short deadline.
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		t.Cleanup(cancel)
		return c
	}
	agentNS, err := js.KeyValue(ctx, subjects.DesiredNamespacesBucket)
	if err != nil {
		t.Fatalf("agent opens desired bucket: %v", err)
	}
	agentApplied, err := js.KeyValue(ctx, subjects.AppliedBucket)
	if err != nil {
		t.Fatalf("agent opens applied bucket: %v", err)
	}
	if _, err := agentApplied.Get(short(), subjects.AppliedKey(subjects.DesiredNamespacesBucket, ownNS)); err != nil {
		t.Errorf("agent reads its own status: %v", err)
	}
	if _, err := agentApplied.Put(short(), subjects.AppliedKey(subjects.DesiredNamespacesBucket, ownNS), []byte("x")); err != nil {
		t.Errorf("agent writes its own status: %v", err)
	}

	if w, err := agentNS.Watch(short(), "c2.>"); err == nil {
		select {
		case e := <-w.Updates():
			if e != nil {
				t.Errorf("agent of c1 watched c2's key %s", e.Key())
			}
		case <-time.After(2 * time.Second):
		}
		_ = w.Stop()
	}
	if w, err := agentNS.WatchAll(short()); err == nil {
		select {
		case e := <-w.Updates():
			if e != nil {
				t.Errorf("agent of c1 watched the whole bucket: %s", e.Key())
			}
		case <-time.After(2 * time.Second):
		}
		_ = w.Stop()
	}
	if e, err := agentNS.Get(short(), otherNS); err == nil {
		t.Errorf("agent of c1 read c2's desired %s", e.Key())
	}
	otherStatus := subjects.AppliedKey(subjects.DesiredNamespacesBucket, otherNS)
	if _, err := appliedKV.Put(ctx, otherStatus, []byte("c2's own")); err != nil {
		t.Fatal(err)
	}
	if e, err := agentApplied.Get(short(), otherStatus); err == nil {
		t.Errorf("agent of c1 read c2's status %s", e.Key())
	}
	if _, err := agentApplied.Put(short(), otherStatus, []byte("forged")); err == nil {
		t.Error("agent of c1 wrote c2's status")
	}
	if e, err := appliedKV.Get(ctx, otherStatus); err != nil || string(e.Value()) != "c2's own" {
		t.Errorf("c2's status after c1's attempt: %v", err)
	}
	if _, err := agentNS.Put(short(), ownNS, []byte("forged")); err == nil {
		t.Error("agent wrote desired state")
	}
}
