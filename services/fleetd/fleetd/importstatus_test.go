package fleetd_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
)

// An import policy says why it imports nothing: its inventory cluster's agent (a real one,
// under its own NATS permissions, against a real kube-apiserver, as a Kubernetes user that may
// list only Cluster API Clusters) reports what it cannot watch, and GetImportPolicy shows it as
// the policy's conditions within seconds.
func TestImportPolicyReportsWhatItsAgentCannotWatch(t *testing.T) {
	inst, client := startFleetd(t)
	inv := testkit.StartKube(t)
	ctx := testkit.Context(t, 3*time.Minute)
	const agentUser = "inventory-agent"
	if _, err := inv.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: agentUser},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"cluster.x-k8s.io"}, Resources: []string{"clusters"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: agentUser},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: agentUser},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: agentUser}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	reg, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "mgmt"}))
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(inv.ConfigAs(agentUser))
	if err != nil {
		t.Fatal(err)
	}
	ag := startAgent(t, ctx, inst, "mgmt", reg.Msg.AgentToken, func(js jetstream.JetStream) (agentRunner, error) {
		a, err := agent.New(agent.Config{ClusterName: "mgmt", HeartbeatInterval: time.Second}, js, inv.Client, testkit.Logger(t))
		if err != nil {
			return nil, err
		}
		a.Add(agent.NewImportWatcher(a, dyn, inv.ClientAs(t, agentUser).Discovery(), agent.ImportWatchConfig{}))
		return a, nil
	})

	pc := clusterv1connect.NewImportPolicyServiceClient(http.DefaultClient, "http://"+inst.Addr,
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+apiToken)
				return next(ctx, req)
			}
		})))
	type want struct {
		typ    string
		status clusterv1.ConditionStatus
		reason string
		text   string
	}
	const (
		yes = clusterv1.ConditionStatus_CONDITION_STATUS_TRUE
		no  = clusterv1.ConditionStatus_CONDITION_STATUS_FALSE
	)
	// shows waits until GetImportPolicy (and ListImportPolicies) show every wanted condition.
	shows := func(name string, within time.Duration, wants ...want) {
		t.Helper()
		start := time.Now()
		testkit.Eventually(t, within, func() error {
			got, err := pc.GetImportPolicy(ctx, connect.NewRequest(&clusterv1.GetImportPolicyRequest{Name: name}))
			if err != nil {
				return err
			}
			list, err := pc.ListImportPolicies(ctx, connect.NewRequest(&clusterv1.ListImportPoliciesRequest{}))
			if err != nil {
				return err
			}
			for _, p := range append(list.Msg.Policies, got.Msg.Policy) {
				if p.Name != name {
					continue
				}
				for _, w := range wants {
					var c *clusterv1.Condition
					for _, have := range p.GetStatus().GetConditions() {
						if have.Type == w.typ {
							c = have
						}
					}
					if c == nil || c.Status != w.status || c.Reason != w.reason || !strings.Contains(c.Message, w.text) {
						return fmt.Errorf("policy %s: %s is %v, want %s %s with %q", name, w.typ, c, w.status, w.reason, w.text)
					}
				}
			}
			return nil
		})
		t.Logf("policy %s showed its conditions after %v", name, time.Since(start).Round(time.Millisecond))
	}

	// Cluster API is not installed yet: the inventory cluster does not serve the source type.
	capi := &clusterv1.ImportPolicy{Name: "capi", Source: &clusterv1.ImportSource{Cluster: "mgmt", Group: "cluster.x-k8s.io", Resource: "clusters"},
		NameTemplate: "{{ .source.metadata.name }}", Template: "labels:\n  provider: capi\n", CreationCondition: "true"}
	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: capi})); err != nil {
		t.Fatal(err)
	}
	shows("capi", 5*time.Second,
		want{"Validated", no, "FailedNegotiateSourceResource", `cluster "mgmt" does not serve clusters.cluster.x-k8s.io: resolve clusters.cluster.x-k8s.io: no matches for`},
		want{"SourceWatched", no, "NotServed", ""})

	// Once it is, the agent (retrying every 10 s) watches it.
	inv.InstallCRD(t, testkit.CAPIClusterCRD)
	shows("capi", 30*time.Second,
		want{"Validated", yes, "Validated", "version v1beta1"},
		want{"SourceWatched", yes, "Watched", ""},
		want{"ReferencesResolved", yes, "NoReferences", ""})

	// A type the agent's Kubernetes user may not list: served, but not watched.
	cms := &clusterv1.ImportPolicy{Name: "cms", Source: &clusterv1.ImportSource{Cluster: "mgmt", Resource: "configmaps", Namespace: "default"},
		NameTemplate: "{{ .source.metadata.name }}", Template: "labels:\n  provider: cm\n", CreationCondition: "true"}
	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: cms})); err != nil {
		t.Fatal(err)
	}
	shows("cms", 5*time.Second,
		want{"Validated", yes, "Validated", "version v1"},
		want{"SourceWatched", no, "Forbidden", `configmaps is forbidden: User "inventory-agent" cannot list resource "configmaps"`})
	shows("capi", time.Second, want{"Validated", yes, "Validated", ""})
	select {
	case err := <-ag.NATSErrors:
		t.Errorf("the agent hit a NATS error (a permission it lacks?): %v", err)
	default:
	}
}
