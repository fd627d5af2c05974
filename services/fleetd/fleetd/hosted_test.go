package fleetd_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-agent/hosted"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// hostedGrace is how long the hosted agents leave a cluster to its own agent after its last
// heartbeat.
const hostedGrace = 3 * time.Second

// withHostedAgents runs fleetd's hosted agents, quick to notice an in-cluster agent's silence.
func withHostedAgents(cfg *fleetd.Config) {
	cfg.HostedAgents = true
	cfg.Hosted = hosted.Config{InClusterGrace: hostedGrace, Retry: time.Second}
	cfg.Hosted.Member.HeartbeatInterval = 500 * time.Millisecond
}

// hostedConnected says whether cluster's agent is connected and is a hosted one (want true) or
// its own (want false).
func hostedConnected(ctx context.Context, client clusterv1connect.ClusterServiceClient, cluster string, want bool) error {
	res, err := client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: cluster}))
	if err != nil {
		return err
	}
	c := res.Msg.Cluster
	cond := clusterimport.Condition(c, clusterimport.ConditionAgentConnected)
	if cond == nil || cond.Status != clusterv1.ConditionStatus_CONDITION_STATUS_TRUE || c.Status.AgentHosted != want {
		return fmt.Errorf("cluster %s: connected %v, hosted %v (want hosted %v)", cluster, cond, c.Status.AgentHosted, want)
	}
	return nil
}

// agentStatus reads cluster's latest heartbeat as cluster-import recorded it.
func agentStatus(ctx context.Context, inst *fleetd.Instance, cluster string) (*clusterv1.AgentStatus, error) {
	kv, err := inst.JS.KeyValue(ctx, subjects.ClusterStatusBucket)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, keys.Encode(cluster))
	if err != nil {
		return nil, err
	}
	st := &clusterv1.AgentStatus{}
	return st, proto.Unmarshal(e.Value(), st)
}

// canI asks the member cluster's own authorizer (SubjectAccessReview) whether user may create
// Deployments in namespace.
func canI(ctx context.Context, kube kubernetes.Interface, user, namespace string) (bool, error) {
	sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: "create", Group: "apps", Resource: "deployments"}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return sar.Status.Allowed, nil
}

func authed() connect.ClientOption { return connect.WithInterceptors(bearer(apiToken)) }

// grantOnClusters binds namespace web of project team-a on every cluster and makes alice a
// project member, through fleetd's API.
func grantOnClusters(t *testing.T, ctx context.Context, inst *fleetd.Instance, clusters ...string) {
	t.Helper()
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, "http://"+inst.Addr, authed())
	if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "team-a"})); err != nil {
		t.Fatal(err)
	}
	for _, c := range clusters {
		if _, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Cluster: c, Namespace: "web"})); err != nil {
			t.Fatal(err)
		}
	}
	rbac := rbacv1connect.NewRBACServiceClient(http.DefaultClient, "http://"+inst.Addr, authed())
	if _, err := rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "team-a",
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}, RoleTemplate: "project-member"})); err != nil {
		t.Fatal(err)
	}
}

// A cluster registered with credentials and no agent of its own gets a hosted agent, which
// leaves it as soon as the cluster's own agent heartbeats and takes it back once that agent has
// been silent for the grace period. A hosted agent's NATS user name cannot be borrowed by an
// agent token.
func TestHostedAgentYieldsToTheClustersOwnAgent(t *testing.T) {
	inst, client := startFleetd(t, withHostedAgents)
	kube := testkit.StartKube(t)
	ctx := testkit.Context(t, 3*time.Minute)
	reg, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "solo",
		Credentials: &clusterv1.ConnectionCredentials{Kubeconfig: kube.Kubeconfig}}))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 60*time.Second, func() error {
		if got := inst.Hosted.Hosting(); !slices.Equal(got, []string{"solo"}) {
			return fmt.Errorf("hosting %v", got)
		}
		return hostedConnected(ctx, client, "solo", true)
	})

	// An agent token presented with a hosted agent's user name is refused: only the
	// hosted-agent service's token may.
	if nc, err := nats.Connect(inst.NATS.ClientURL(), nats.UserInfo(natsauth.HostedAgentUser("solo"), reg.Msg.AgentToken)); err == nil {
		nc.Close()
		t.Error("an agent token connected as a hosted agent")
	}

	// The cluster's own agent appears: the hosted one stops.
	nc, err := connectAgent(inst, "solo", reg.Msg.AgentToken, make(chan error, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	own, err := agent.New(agent.Config{ClusterName: "solo", HeartbeatInterval: 500 * time.Millisecond}, js, kube.Client, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	actx, stopOwn := context.WithCancel(ctx)
	ownDone := make(chan error, 1)
	go func() { ownDone <- own.Run(actx) }()
	testkit.Eventually(t, 30*time.Second, func() error {
		if got := inst.Hosted.Hosting(); len(got) != 0 {
			return fmt.Errorf("still hosting %v", got)
		}
		return hostedConnected(ctx, client, "solo", false)
	})
	// ...and stays stopped while the cluster's own agent runs. Time is what is tested: were the
	// own agent's heartbeats (one every 500 ms) lost on the way, the hosted agent would come
	// back once the grace since the last one seen ran out (the supervisor looks at the cluster
	// again then), so the window spans it, with two seconds to spare. The sleep paces the polls.
	for end := time.Now().Add(hostedGrace + 2*time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if got := inst.Hosted.Hosting(); len(got) != 0 {
			t.Fatalf("hosted agent came back beside the cluster's own: %v", got)
		}
	}

	// The cluster's own agent goes silent: after the grace period the hosted agent takes over.
	stopOwn()
	if err := <-ownDone; err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	testkit.Eventually(t, 30*time.Second, func() error {
		if got := inst.Hosted.Hosting(); !slices.Equal(got, []string{"solo"}) {
			return fmt.Errorf("hosting %v", got)
		}
		return hostedConnected(ctx, client, "solo", true)
	})
	t.Logf("hosted agent took over %s after the cluster's own agent stopped", time.Since(stopped).Round(100*time.Millisecond))
}
