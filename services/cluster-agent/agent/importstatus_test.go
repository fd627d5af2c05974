package agent_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
)

// The agent says which of the types its import watch names it cannot watch, and why, on its
// importstatus subject: a source type the API server does not serve, a referenced type its
// Kubernetes user may not list; and forgets them when the spec no longer names them. A new
// session reports again, replacing the earlier one's report.
func TestImportWatcherReportsWhatItCannotWatch(t *testing.T) {
	t.Parallel()
	j, k := testkit.StartJetStream(t), testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	ensureStream(t, ctx, j.JS)
	const user = "import-agent"
	if _, err := k.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.ImportWatchBucket})
	if err != nil {
		t.Fatal(err)
	}
	put := func(w *agentv1.ImportWatch) {
		t.Helper()
		data, _ := proto.Marshal(w)
		if _, err := kv.Put(ctx, subjects.ImportWatchKey(cluster), data); err != nil {
			t.Fatal(err)
		}
	}
	run := func() (stop func()) {
		a, err := agent.New(agent.Config{ClusterName: cluster, HeartbeatInterval: time.Hour}, j.JS, k.Client, testkit.Logger(t))
		if err != nil {
			t.Fatal(err)
		}
		dyn, err := dynamic.NewForConfig(k.ConfigAs(user))
		if err != nil {
			t.Fatal(err)
		}
		a.Add(agent.NewImportWatcher(a, dyn, k.ClientAs(t, user).Discovery(), agent.ImportWatchConfig{}))
		actx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- a.Run(actx) }()
		var once sync.Once
		stop = func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("agent run: %v", err)
				}
			})
		}
		t.Cleanup(stop)
		return stop
	}
	// status waits for a report whose types are exactly want (reason and a part of the
	// message), from a session other than not.
	type want struct{ reason, text string }
	status := func(not string, wants map[string]want) *agentv1.ImportWatchStatus {
		t.Helper()
		var got *agentv1.ImportWatchStatus
		testkit.Eventually(t, 10*time.Second, func() error {
			r, err := latest[*agentv1.ImportWatchStatus](ctx, j.JS, subjects.AgentImportWatchStatus(cluster))
			if err != nil {
				return err
			}
			got = r.payload
			if got.ClusterName != cluster || got.SessionId == not {
				return fmt.Errorf("status of %s, session %s", got.ClusterName, got.SessionId)
			}
			if len(got.Types) != len(wants) {
				return fmt.Errorf("types %v, want %d", got.Types, len(wants))
			}
			for _, ty := range got.Types {
				name := fmt.Sprintf("%s.%s/%s source=%v", ty.Resource, ty.Group, ty.Namespace, ty.Source)
				w, ok := wants[name]
				switch {
				case !ok:
					return fmt.Errorf("unexpected %s in %v", name, got.Types)
				case ty.Reason != w.reason || !strings.Contains(ty.Message, w.text):
					return fmt.Errorf("%s: %s %q, want %s with %q", name, ty.Reason, ty.Message, w.reason, w.text)
				case len(ty.Message) > agent.ImportStatusMaxMessage:
					return fmt.Errorf("%s: message of %d bytes", name, len(ty.Message))
				case ty.Reason == "" && (!ty.Synced || ty.Version != "v1"):
					return fmt.Errorf("%s: watched but synced %v, version %q", name, ty.Synced, ty.Version)
				case ty.Since == nil:
					return fmt.Errorf("%s: no time", name)
				}
			}
			return nil
		})
		return got
	}

	put(&agentv1.ImportWatch{
		Sources: []*agentv1.WatchedType{{Resource: "configmaps", Namespace: "default"}, {Group: "cluster.x-k8s.io", Resource: "clusters"}},
		References: []*agentv1.WatchedObject{{Version: "v1", Resource: "secrets", Namespace: "capi", Name: "alpha-kubeconfig"},
			{Version: "v1", Resource: "configmaps", Namespace: "capi", Name: "settings"}},
	})
	stop := run()
	first := status("", map[string]want{
		"configmaps./default source=true":        {"", ""},
		"clusters.cluster.x-k8s.io/ source=true": {"NotServed", "no matches for cluster.x-k8s.io/, Resource=clusters"},
		// A reference type is named only when it fails.
		"secrets./capi source=false": {"Forbidden", `secrets is forbidden: User "import-agent" cannot list resource "secrets"`},
	})
	put(&agentv1.ImportWatch{Sources: []*agentv1.WatchedType{{Resource: "configmaps", Namespace: "default"}}})
	status("", map[string]want{"configmaps./default source=true": {"", ""}})
	stop()
	run()
	status(first.SessionId, map[string]want{"configmaps./default source=true": {"", ""}})
}
