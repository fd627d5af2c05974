package fleetd_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

// A project's namespace, bound through fleetd's API, reaches a real member cluster through an
// agent on its restricted NATS credentials, and its phase comes back.
func TestProjectNamespaceReachesTheClusterThroughFleetd(t *testing.T) {
	inst, clusters := startFleetd(t)
	kube := testkit.StartKube(t)
	ctx := testkit.Context(t, 2*time.Minute)
	reg, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1"}))
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	ag := startAgent(t, ctx, inst, "c1", reg.Msg.AgentToken, func(js jetstream.JetStream) (agentRunner, error) {
		a, err := agent.New(agent.Config{ClusterName: "c1", HeartbeatInterval: 500 * time.Millisecond}, js, kube.Client, testkit.Logger(t))
		if err != nil {
			return nil, err
		}
		applier, err := desired.New(desired.Config{ClusterName: "c1"}, js, dyn, kube.Client.Discovery(), testkit.Logger(t))
		if err != nil {
			return nil, err
		}
		a.Add(applier)
		return a, nil
	})
	defer func() {
		if err := ag.Stop(); err != nil {
			t.Errorf("agent: %v", err)
		}
	}()

	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, "http://"+inst.Addr,
		connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+apiToken)
				return next(ctx, req)
			}
		})))
	if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "team-a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web",
		Hard: map[string]string{"cpu": "2"}})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, func() error {
		res, err := projects.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: "team-a"}))
		if err != nil {
			return err
		}
		if len(res.Msg.Bindings) != 1 || res.Msg.Bindings[0].Phase != projectv1.BindingPhase_BINDING_PHASE_AVAILABLE {
			return fmt.Errorf("bindings %v", res.Msg.Bindings)
		}
		return nil
	})
	ns, err := kube.Client.CoreV1().Namespaces().Get(ctx, "web", metav1.GetOptions{})
	if err != nil || ns.Labels[namespacebinding.ProjectLabel] != "team-a" {
		t.Fatalf("namespace web: %v %v", ns, err)
	}
	rq, err := kube.Client.CoreV1().ResourceQuotas("web").Get(ctx, namespacebinding.QuotaName, metav1.GetOptions{})
	if err != nil || rq.Spec.Hard.Cpu().String() != "2" {
		t.Fatalf("quota: %v %v", rq, err)
	}
}
