package fleetd_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/jsm.go"
	jsmbackup "github.com/nats-io/jsm.go/backup"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/fleetstream/fleetstream/pkg/backup"
	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1/auditv1connect"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1/placementv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/sealed"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/version"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/cluster-agent/endpointslices"
	"github.com/fleetstream/fleetstream/services/cluster-agent/member"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// An upgrade fixture is a backup of a fleetd that a release of Fleetstream (N−1) wrote through a
// scripted set of API calls, with what its List APIs then answered; TestUpgradeFromRecordedFixture
// restores every fixture into the current code (N) and checks it reads what N−1 wrote. The
// fixtures live in testdata/upgrade/<NAME>/:
//
//	fixture.json      who recorded it, the tokens it handed out, the event types its streams hold
//	credentials.key   the test-only key the cluster credentials are sealed with
//	expected.json     every List answer of upgradeLists, as protobuf JSON
//	backup/           the backup (pkg/backup), as `fleetctl admin backup` writes it
//
// `make upgrade-fixture` records a new one from the checkout (docs/operations.md, "Upgrades").
var recordUpgradeFixture = flag.String("record-upgrade-fixture", "",
	"record a new upgrade fixture into testdata/upgrade/`NAME` (TestRecordUpgradeFixture; make upgrade-fixture)")

const upgradeFixtures = "testdata/upgrade"

// upgradeFixture is a fixture's fixture.json.
type upgradeFixture struct {
	// Version is the Fleetstream version and Commit the commit that recorded it.
	Version  string    `json:"version"`
	Commit   string    `json:"commit,omitempty"`
	Recorded time.Time `json:"recorded"`
	// AgentTokens and SubscriberTokens are the NATS tokens the fixture's hub handed out, by
	// cluster and subscriber name: test-only, like the key.
	AgentTokens      map[string]string `json:"agentTokens"`
	SubscriberTokens map[string]string `json:"subscriberTokens"`
	// SealedClusters is how many clusters have sealed credentials.
	SealedClusters int `json:"sealedClusters"`
	// EventTypes are the envelope types in the fixture's domain streams, with their counts.
	EventTypes map[string]int `json:"eventTypes"`

	// finish, while recording, stops what the history started (the agent).
	finish func()
}

// Records a new upgrade fixture; skipped unless -record-upgrade-fixture names it.
func TestRecordUpgradeFixture(t *testing.T) {
	if *recordUpgradeFixture == "" {
		t.Skip("records a fixture only with -record-upgrade-fixture=NAME (make upgrade-fixture)")
	}
	name := *recordUpgradeFixture
	if strings.ContainsAny(name, `/\`) || name == "." || name == ".." {
		t.Fatalf("-record-upgrade-fixture: %q is not a directory name", name)
	}
	out := filepath.Join(upgradeFixtures, name)
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("%s exists: a fixture is recorded once; choose another name", out)
	}
	ctx := testkit.Context(t, 2*time.Minute)
	dir := t.TempDir()
	adminToken := filepath.Join(dir, "nats-admin.token")
	if err := os.WriteFile(adminToken, []byte("upgrade-fixture-admin-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fleetd.Config{DataDir: filepath.Join(dir, "data"), Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true},
		NATSListen: "127.0.0.1:0", NATSAdminTokenFile: adminToken,
		// Short, so that the fixture's agent is lost within the recording.
		ClusterImport: clusterimport.Config{UnreachableAfter: 2 * time.Second},
		// A decision whose scores alone change (eu-web's Balance, once everywhere loses eu-1)
		// is stored at once rather than deferred by the default 10 s past the recording's end:
		// a restarted scheduler stores a deferred one at once, so the restored hub (N−1's own
		// as well as N's) would answer a decision the fixture did not record.
		NamespaceBinding: namespacebinding.Config{ScoreRefresh: time.Millisecond}}
	inst := startData(t, ctx, cfg)
	fx := recordUpgradeScenario(t, ctx, inst)
	waitSettled(t, ctx, inst)
	answers := upgradeLists(t, ctx, "http://"+inst.Addr)

	nc, err := nats.Connect(inst.NATS.ClientURL(), nats.Token("upgrade-fixture-admin-token"),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.AdminUser)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tmp := filepath.Join(dir, "fixture")
	if _, err := backup.Backup(ctx, nc, filepath.Join(tmp, "backup"), backup.Options{Version: version.Version}); err != nil {
		t.Fatal(err)
	}
	inst.Stop()
	key, err := os.ReadFile(fleetd.DefaultCredentialsKeyFile(cfg.DataDir))
	if err != nil {
		t.Fatal(err)
	}
	fx.Version, fx.Commit, fx.Recorded = version.Version, os.Getenv("UPGRADE_FIXTURE_COMMIT"), time.Now().UTC().Truncate(time.Second)
	fx.EventTypes = backupEventTypes(t, filepath.Join(tmp, "backup"))
	expected := map[string]json.RawMessage{}
	for k, m := range answers {
		expected[k] = marshalStable(t, m)
	}
	for file, v := range map[string]any{"fixture.json": fx, "expected.json": expected} {
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, file), append(data, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, "credentials.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(upgradeFixtures, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(out, os.DirFS(tmp)); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %s: %d event types, %d lists", out, len(fx.EventTypes), len(expected))
}

// N reads what N−1 wrote: every fixture under testdata/upgrade, restored with fleetd's restore
// into a new data dir and served by this code with the fixture's key: every view equal to its
// rebuild from the restored streams, every List answering at least what the recording answered,
// the sealed credentials opening, the fixture's agent and subscriber tokens admitted, and new
// writes working on top.
func TestUpgradeFromRecordedFixture(t *testing.T) {
	entries, err := os.ReadDir(upgradeFixtures)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	covered := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		found++
		t.Run(e.Name(), func(t *testing.T) {
			for typ := range checkUpgradeFixture(t, filepath.Join(upgradeFixtures, e.Name())).EventTypes {
				covered[typ] = true
			}
		})
	}
	if found == 0 {
		t.Fatalf("no fixture in %s: record one (make upgrade-fixture)", upgradeFixtures)
	}
	// For whoever records the next fixture: the catalogue's event types no fixture holds (new
	// ones cannot be in an older version's fixture; others may want a line in the history).
	catalogue, err := os.ReadFile("../../../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, line := range strings.Split(string(catalogue), "\n") {
		if typ, ok := strings.CutPrefix(line, "### "); ok && strings.HasPrefix(typ, "fleetstream.") && !covered[typ] {
			missing = append(missing, typ)
		}
	}
	t.Logf("types of docs/events.md (events, and messages they embed) in no fixture: %v", missing)
}

// checkUpgradeFixture checks one fixture and returns its fixture.json.
func checkUpgradeFixture(t *testing.T, fixture string) upgradeFixture {
	ctx := testkit.Context(t, 2*time.Minute)
	var fx upgradeFixture
	readJSON(t, filepath.Join(fixture, "fixture.json"), &fx)
	var expected map[string]json.RawMessage
	readJSON(t, filepath.Join(fixture, "expected.json"), &expected)
	dir := t.TempDir()
	cfg := fleetd.Config{DataDir: filepath.Join(dir, "data"), Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true},
		NATSListen: "127.0.0.1:0", CredentialsKeyFile: copyFile(t, filepath.Join(fixture, "credentials.key"))}

	// The operator's path: fleetd restore into a new data dir, then fleetd on it.
	m, err := fleetd.Restore(ctx, fleetd.RestoreConfig{DataDir: cfg.DataDir, From: filepath.Join(fixture, "backup")}, testkit.Logger(t))
	if err != nil {
		t.Fatalf("restore the fixture (recorded by %s %s): %v", fx.Version, fx.Commit, err)
	}
	t.Logf("fixture recorded by %s %s at %s: %d streams, %d event types", fx.Version, fx.Commit, fx.Recorded.Format(time.RFC3339), len(m.Streams), len(fx.EventTypes))
	inst := startData(t, ctx, cfg)
	testkit.WaitProjected(t, inst.JS, upgradeProjections()...)
	verifyViews(t, ctx, inst, "after the upgrade")

	// Every List answers at least what N−1 answered: a field N−1 answered is there with its
	// value, an empty one empty (new fields may be added), lists hold the same entries in the
	// same order.
	got := upgradeLists(t, ctx, "http://"+inst.Addr)
	for _, k := range slices.Sorted(mapKeys(expected)) {
		m, ok := got[k]
		if !ok {
			t.Errorf("%s: answered by the fixture's version, not listed by this one", k)
			continue
		}
		var want, have any
		if err := json.Unmarshal(expected[k], &want); err != nil {
			t.Fatalf("expected.json %s: %v", k, err)
		}
		if err := json.Unmarshal(marshalStable(t, m), &have); err != nil {
			t.Fatal(err)
		}
		for _, d := range jsonSubset(k, want, have) {
			t.Error(d)
		}
	}

	// The fixture's agents and subscribers get in with their tokens; a made-up token does not.
	for name, token := range fx.AgentTokens {
		nc, err := connectAgent(inst, name, token, make(chan error, 1))
		if err != nil {
			t.Errorf("agent of %s with the fixture's token: %v", name, err)
			continue
		}
		nc.Close()
	}
	for name, token := range fx.SubscriberTokens {
		nc, err := nats.Connect(inst.NATS.ClientURL(), nats.Token(token), nats.CustomInboxPrefix(natsauth.SubscriberInboxPrefix(name)))
		if err != nil {
			t.Errorf("subscriber %s with the fixture's token: %v", name, err)
			continue
		}
		nc.Close()
	}
	if nc, err := nats.Connect(inst.NATS.ClientURL(), nats.Token("not-a-token-of-the-fixture")); err == nil {
		nc.Close()
		t.Error("a made-up token connected to the upgraded hub")
	}

	// New writes on top of the old events: a cluster registered, a namespace bound, a role granted.
	base := "http://" + inst.Addr
	clusters := clusterv1connect.NewClusterServiceClient(http.DefaultClient, base)
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, base)
	rbac := rbacv1connect.NewRBACServiceClient(http.DefaultClient, base)
	if _, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "after-upgrade",
		Labels: map[string]string{"env": "prod"}})); err != nil {
		t.Fatalf("register a cluster after the upgrade: %v", err)
	}
	if _, err := clusters.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "eu-1",
		Labels: map[string]string{"region": "eu", "env": "prod", "upgraded": "yes"}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}})); err != nil {
		t.Fatalf("update a cluster of the fixture after the upgrade: %v", err)
	}
	if _, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Cluster: "after-upgrade",
		Namespace: "web-new", Hard: map[string]string{"pods": "5"}})); err != nil {
		t.Fatalf("bind a namespace after the upgrade: %v", err)
	}
	if _, err := rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: "team-a",
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "dana"}, RoleTemplate: "app-admin"})); err != nil {
		t.Fatalf("grant a role after the upgrade: %v", err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		res, err := projects.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: "team-a", Cluster: "after-upgrade"}))
		if err != nil {
			return err
		}
		if len(res.Msg.Bindings) != 1 {
			return fmt.Errorf("bindings of team-a on after-upgrade: %v", res.Msg.Bindings)
		}
		rb, err := rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: "team-a",
			Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "dana"}}))
		if err != nil {
			return err
		}
		if len(rb.Msg.Bindings) != 1 {
			return fmt.Errorf("dana's bindings in team-a: %v", rb.Msg.Bindings)
		}
		c, err := clusters.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "eu-1"}))
		if err != nil {
			return err
		}
		if c.Msg.Cluster.Labels["upgraded"] != "yes" {
			return fmt.Errorf("eu-1's labels %v", c.Msg.Cluster.Labels)
		}
		return nil
	})
	testkit.WaitProjected(t, inst.JS, upgradeProjections()...)
	verifyViews(t, ctx, inst, "after new writes")
	inst.Stop()

	// The sealed credentials open with the fixture's key, and not with another: a rotation must
	// open every one to reseal it.
	other := filepath.Join(t.TempDir(), "other.key")
	if _, err := sealed.CreateKeyFile(other, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := fleetd.RotateCredentialsKey(ctx, fleetd.RotateConfig{DataDir: cfg.DataDir, KeyFile: other}, testkit.Logger(t)); err == nil {
		t.Error("the fixture's sealed credentials opened with a key that is not the fixture's")
	} else {
		t.Logf("with another key: %v", err)
	}
	rot, err := fleetd.RotateCredentialsKey(ctx, fleetd.RotateConfig{DataDir: cfg.DataDir, KeyFile: copyFile(t, cfg.CredentialsKeyFile), NewKey: true}, testkit.Logger(t))
	if err != nil {
		t.Fatalf("open the fixture's sealed credentials with its key: %v", err)
	}
	if rot.Report.Total() != fx.SealedClusters {
		t.Errorf("resealed %d clusters' credentials, the fixture has %d", rot.Report.Total(), fx.SealedClusters)
	}
	return fx
}

// recordUpgradeScenario is the fixture's history: every kind of write the API offers on fleetd,
// an agent that connects, reports and is lost, and an unbind or a delete of most kinds.
func recordUpgradeScenario(t *testing.T, ctx context.Context, inst *fleetd.Instance) upgradeFixture {
	t.Helper()
	base := "http://" + inst.Addr
	clusters := clusterv1connect.NewClusterServiceClient(http.DefaultClient, base)
	policies := clusterv1connect.NewImportPolicyServiceClient(http.DefaultClient, base)
	subscribers := clusterv1connect.NewSubscriberServiceClient(http.DefaultClient, base)
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, base)
	rbac := rbacv1connect.NewRBACServiceClient(http.DefaultClient, base)
	sets := placementv1connect.NewClusterSetServiceClient(http.DefaultClient, base)
	placements := placementv1connect.NewPlacementServiceClient(http.DefaultClient, base)
	endpoints := endpointv1connect.NewEndpointServiceClient(http.DefaultClient, base)
	fx := upgradeFixture{AgentTokens: map[string]string{}, SubscriberTokens: map[string]string{}}
	must := func(what string, _ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	user := func(name string) *rbacv1.Subject {
		return &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: name}
	}

	// Clusters: labels, claims, taints, sealed credentials; one updated, one deregistered.
	for _, c := range []struct {
		name           string
		labels, claims map[string]string
		taints         []*clusterv1.Taint
		creds          *clusterv1.ConnectionCredentials
	}{
		{"eu-1", map[string]string{"region": "eu", "env": "prod"}, map[string]string{"id.k8s.io": "eu-1-uid"}, nil, nil},
		{"eu-2", map[string]string{"region": "eu", "env": "staging"}, nil,
			[]*clusterv1.Taint{{Key: "maintenance", Value: "true", Effect: clusterv1.TaintEffect_TAINT_EFFECT_PREFER_NO_SELECT}}, nil},
		{"us-1", map[string]string{"region": "us", "env": "prod"}, map[string]string{"platform": "gke"}, nil,
			&clusterv1.ConnectionCredentials{Server: "https://10.0.0.1:6443", Token: "upgrade-fixture-cluster-token"}},
		{"mgmt", map[string]string{"role": "management"}, nil, nil, nil},
		{"gone", map[string]string{"region": "us"}, nil, nil, nil},
	} {
		res, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: c.name, Labels: c.labels,
			Claims: c.claims, Taints: c.taints, Credentials: c.creds}))
		must("register "+c.name, nil, err)
		if c.name != "gone" {
			fx.AgentTokens[c.name] = res.Msg.AgentToken
		}
	}
	_, err := clusters.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "eu-2",
		Labels: map[string]string{"region": "eu", "env": "prod"}, Claims: map[string]string{"id.k8s.io": "eu-2-uid"},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels", "claims"}}}))
	must("update eu-2", nil, err)
	_, err = clusters.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "us-1",
		Credentials: &clusterv1.ConnectionCredentials{Server: "https://10.0.0.1:6443", Token: "upgrade-fixture-cluster-token-2"},
		UpdateMask:  &fieldmaskpb.FieldMask{Paths: []string{"credentials"}}}))
	must("rotate us-1's credentials", nil, err)
	_, err = clusters.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "gone"}))
	must("deregister gone", nil, err)

	// eu-1's agent, the real one against a real kube-apiserver, connects with its token: it
	// heartbeats, reports its node's resources, its namespaces and an EndpointSlice, and applies
	// what is bound to eu-1 (the bindings' status and the applied objects are in the fixture).
	// finish stops it once the history is written: the agent is then lost.
	kube := testkit.StartKube(t)
	node, err := kube.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
	must("create node", nil, err)
	node.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")},
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("7500m"), corev1.ResourceMemory: resource.MustParse("30Gi")},
		Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}},
	}
	_, err = kube.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	must("node status", nil, err)
	ag := startAgent(t, ctx, inst, "eu-1", fx.AgentTokens["eu-1"], func(ajs jetstream.JetStream) (agentRunner, error) {
		return member.New(member.Config{ClusterName: "eu-1", HeartbeatInterval: 300 * time.Millisecond, Version: "v0.0.0-fixture",
			EndpointSlices: &endpointslices.Filter{Kind: "all"}}, ajs, kube.Config, testkit.Logger(t).Named("agent"))
	})
	fx.finish = func() {
		if err := ag.Stop(); err != nil {
			t.Errorf("eu-1's agent: %v", err)
		}
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		res, err := clusters.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "eu-1"}))
		if err != nil {
			return err
		}
		if len(res.Msg.Cluster.Taints) > 0 || res.Msg.Cluster.GetStatus().GetResources().GetNodeCount() != 1 {
			return fmt.Errorf("eu-1's agent not heard yet: %v %v", res.Msg.Cluster.Taints, res.Msg.Cluster.GetStatus())
		}
		return nil
	})

	// Projects, budgets, namespaces (a quota change, an unbind), one deleted.
	for _, p := range []string{"team-a", "team-b", "scratch"} {
		_, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: p}))
		must("create project "+p, nil, err)
	}
	_, err = projects.SetProjectBudget(ctx, connect.NewRequest(&projectv1.SetProjectBudgetRequest{Project: "team-a", Cluster: "eu-1",
		Hard: map[string]string{"pods": "100", "requests.cpu": "20"}}))
	must("budget team-a", nil, err)
	for _, b := range []struct{ project, cluster, ns string }{{"team-a", "eu-1", "web"}, {"team-a", "us-1", "web"}, {"team-b", "eu-2", "batch"}, {"team-b", "eu-1", "tmp"}} {
		_, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: b.project, Cluster: b.cluster,
			Namespace: b.ns, Hard: map[string]string{"pods": "10", "requests.cpu": "2"}}))
		must("bind "+b.project+"/"+b.cluster+"/"+b.ns, nil, err)
	}
	_, err = projects.UpdateQuota(ctx, connect.NewRequest(&projectv1.UpdateQuotaRequest{Project: "team-a", Cluster: "eu-1", Namespace: "web",
		Hard: map[string]string{"pods": "20", "requests.cpu": "4", "requests.memory": "8Gi"}}))
	must("quota team-a/eu-1/web", nil, err)
	_, err = projects.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-b", Cluster: "eu-1", Namespace: "tmp",
		Policy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE}))
	must("unbind team-b/eu-1/tmp", nil, err)
	_, err = projects.DeleteProject(ctx, connect.NewRequest(&projectv1.DeleteProjectRequest{Name: "scratch"}))
	must("delete project scratch", nil, err)

	// Role templates with inheritance (one updated, one deleted), project role bindings, an unbind.
	for _, rt := range []*rbacv1.RoleTemplate{
		{Name: "pod-reader", DisplayName: "Pod reader", Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get", "list", "watch"}, ApiGroups: []string{""}, Resources: []string{"pods", "pods/log"}}}},
		{Name: "deployer", Inherits: []string{"pod-reader"}, Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get", "update", "patch"}, ApiGroups: []string{"apps"}, Resources: []string{"deployments"}}}},
		{Name: "app-admin", Inherits: []string{"deployer"}, Rules: []*rbacv1.PolicyRule{{Verbs: []string{"*"}, ApiGroups: []string{""}, Resources: []string{"configmaps", "secrets"}}}},
		{Name: "temporary", Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get"}, ApiGroups: []string{""}, Resources: []string{"events"}}}},
	} {
		_, err := rbac.CreateRoleTemplate(ctx, connect.NewRequest(&rbacv1.CreateRoleTemplateRequest{Template: rt}))
		must("create role template "+rt.Name, nil, err)
	}
	_, err = rbac.UpdateRoleTemplate(ctx, connect.NewRequest(&rbacv1.UpdateRoleTemplateRequest{Template: &rbacv1.RoleTemplate{Name: "deployer",
		Inherits: []string{"pod-reader"}, Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get", "update", "patch"}, ApiGroups: []string{"apps"}, Resources: []string{"deployments", "statefulsets"}}}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"rules"}}}))
	must("update role template deployer", nil, err)
	_, err = rbac.DeleteRoleTemplate(ctx, connect.NewRequest(&rbacv1.DeleteRoleTemplateRequest{Name: "temporary"}))
	must("delete role template temporary", nil, err)
	for _, b := range []struct{ project, user, role string }{{"team-a", "alice", "app-admin"}, {"team-a", "bob", "pod-reader"}, {"team-b", "carol", "deployer"}, {"team-b", "bob", "pod-reader"}} {
		_, err := rbac.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{Project: b.project, Subject: user(b.user), RoleTemplate: b.role}))
		must("bind "+b.user+" "+b.role+" in "+b.project, nil, err)
	}
	_, err = rbac.UnbindProjectRole(ctx, connect.NewRequest(&rbacv1.UnbindProjectRoleRequest{Project: "team-b", Subject: user("bob"), RoleTemplate: "pod-reader"}))
	must("unbind bob in team-b", nil, err)

	// Cluster sets (one updated, one deleted), set bindings (one unbound), set roles (one unbound).
	labelSet := func(kv ...string) *placementv1.ClusterSetSelector {
		return &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR,
			LabelSelector: &placementv1.LabelSelector{MatchLabels: map[string]string{kv[0]: kv[1]}}}
	}
	for _, s := range []struct {
		name string
		sel  *placementv1.ClusterSetSelector
	}{{"eu", labelSet("region", "eu")}, {"prod", labelSet("env", "prod")}, {"old", labelSet("region", "us")}} {
		_, err := sets.CreateClusterSet(ctx, connect.NewRequest(&placementv1.CreateClusterSetRequest{Name: s.name, Selector: s.sel}))
		must("create cluster set "+s.name, nil, err)
	}
	_, err = sets.UpdateClusterSet(ctx, connect.NewRequest(&placementv1.UpdateClusterSetRequest{Name: "eu",
		Selector: &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR,
			LabelSelector: &placementv1.LabelSelector{MatchExpressions: []*placementv1.LabelSelectorRequirement{{Key: "region", Operator: "In", Values: []string{"eu", "eu-west"}}}}}}))
	must("update cluster set eu", nil, err)
	_, err = sets.DeleteClusterSet(ctx, connect.NewRequest(&placementv1.DeleteClusterSetRequest{Name: "old"}))
	must("delete cluster set old", nil, err)
	for _, b := range []struct{ project, set string }{{"team-a", "eu"}, {"team-a", "prod"}, {"team-b", "eu"}} {
		_, err := sets.BindClusterSet(ctx, connect.NewRequest(&placementv1.BindClusterSetRequest{Project: b.project, ClusterSet: b.set}))
		must("bind set "+b.set+" to "+b.project, nil, err)
	}
	_, err = sets.UnbindClusterSet(ctx, connect.NewRequest(&placementv1.UnbindClusterSetRequest{Project: "team-b", ClusterSet: "eu"}))
	must("unbind set eu from team-b", nil, err)
	for _, u := range []string{"erin", "frank"} {
		_, err := sets.BindClusterSetRole(ctx, connect.NewRequest(&placementv1.BindClusterSetRoleRequest{ClusterSet: "prod", Subject: user(u), Role: "clusterset-admin"}))
		must("bind set role for "+u, nil, err)
	}
	_, err = sets.UnbindClusterSetRole(ctx, connect.NewRequest(&placementv1.UnbindClusterSetRoleRequest{ClusterSet: "prod", Subject: user("frank"), Role: "clusterset-admin"}))
	must("unbind frank's set role", nil, err)

	// Placements (one updated, one deleted), an add-on score, a namespace following a placement.
	two := int32(2)
	_, err = placements.CreatePlacement(ctx, connect.NewRequest(&placementv1.CreatePlacementRequest{Placement: &placementv1.Placement{
		Project: "team-a", Name: "eu-web", ClusterSets: []string{"eu"}, NumberOfClusters: &two,
		Predicates: []*placementv1.Predicate{{RequiredClusterSelector: &placementv1.ClusterSelector{LabelSelector: &placementv1.LabelSelector{
			MatchLabels: map[string]string{"env": "prod"}}}}},
		// Unreachable tolerated: eu-2's agent never connects and eu-1's is lost before the
		// recording ends, so without it eu-web would decide nothing and the fixture would
		// hold no decision with clusters to check (nor namespaces following it).
		Tolerations: []*placementv1.Toleration{{Key: "maintenance", Operator: "Exists"}, {Key: "fleetstream.io/unreachable", Operator: "Exists"}}}}))
	must("create placement eu-web", nil, err)
	// everywhere tolerates unreachable too, so that its decision stands when eu-1's agent is
	// lost: a decision of another placement changing moves eu-web's Balance scores without
	// re-deciding eu-web, which a restarted scheduler (N−1's as well as N's) then would, and
	// the restored hub would answer a decision the fixture did not record.
	unreachable := &placementv1.Toleration{Key: "fleetstream.io/unreachable", Operator: "Exists"}
	for _, name := range []string{"everywhere", "doomed"} {
		_, err := placements.CreatePlacement(ctx, connect.NewRequest(&placementv1.CreatePlacementRequest{Placement: &placementv1.Placement{Project: "team-a", Name: name,
			Tolerations: []*placementv1.Toleration{unreachable}}}))
		must("create placement "+name, nil, err)
	}
	one := int32(1)
	_, err = placements.UpdatePlacement(ctx, connect.NewRequest(&placementv1.UpdatePlacementRequest{Placement: &placementv1.Placement{
		Project: "team-a", Name: "everywhere", NumberOfClusters: &one, Tolerations: []*placementv1.Toleration{unreachable}}}))
	must("update placement everywhere", nil, err)
	_, err = placements.DeletePlacement(ctx, connect.NewRequest(&placementv1.DeletePlacementRequest{Project: "team-a", Name: "doomed"}))
	must("delete placement doomed", nil, err)
	_, err = placements.SetAddOnScore(ctx, connect.NewRequest(&placementv1.SetAddOnScoreRequest{Cluster: "eu-1", ResourceName: "cost", ScoreName: "cheap", Score: 80}))
	must("add-on score", nil, err)
	_, err = projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Namespace: "shop", Placement: "eu-web",
		Hard: map[string]string{"pods": "30", "requests.cpu": "3"}}))
	must("bind shop to placement eu-web", nil, err)
	_, err = projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Namespace: "cache", Placement: "everywhere",
		Hard: map[string]string{"pods": "5", "requests.cpu": "1"}}))
	must("bind cache to placement everywhere", nil, err)
	_, err = projects.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Namespace: "cache", Placement: "everywhere",
		Policy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE}))
	must("unbind cache from placement everywhere", nil, err)
	// eu-web decides eu-1 and eu-2 (the two prod clusters of set eu, unreachable tolerated),
	// and shop follows it there: the fixture holds a decision with clusters.
	testkit.Eventually(t, 30*time.Second, func() error {
		res, err := placements.GetPlacementDecisions(ctx, connect.NewRequest(&placementv1.GetPlacementDecisionsRequest{Project: "team-a", Name: "eu-web"}))
		if err != nil {
			return err
		}
		var n int32
		for _, g := range res.Msg.GetDecisions().GetGroups() {
			n += g.ClustersCount
		}
		if n != 2 {
			return fmt.Errorf("eu-web decided %d clusters, want eu-1 and eu-2", n)
		}
		return nil
	})

	// An import policy (updated), a subscriber kept and one deleted, endpoint and cluster weights.
	// eu-1 serves Cluster API Clusters and their kubeconfig Secrets (its own kubeconfig): the
	// policy imports alpha and gamma and adopts eu-2, registered by hand; gamma's source is then
	// deleted, which removes it.
	kube.InstallCRD(t, testkit.CAPIClusterCRD)
	_, err = kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "capi"}}, metav1.CreateOptions{})
	must("create namespace capi", nil, err)
	dyn, err := dynamic.NewForConfig(kube.Config)
	must("dynamic client", nil, err)
	capi := dyn.Resource(schema.GroupVersionResource{Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters"}).Namespace("capi")
	for _, name := range []string{"alpha", "eu-2", "gamma"} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
			"metadata": map[string]any{"name": name, "namespace": "capi", "labels": map[string]any{"env": "prod"}},
			"status":   map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}},
		}}
		cur, err := capi.Create(ctx, u, metav1.CreateOptions{})
		must("create CAPI Cluster "+name, nil, err)
		u.SetResourceVersion(cur.GetResourceVersion())
		_, err = capi.UpdateStatus(ctx, u, metav1.UpdateOptions{})
		must("status of CAPI Cluster "+name, nil, err)
		_, err = kube.Client.CoreV1().Secrets("capi").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-kubeconfig", Namespace: "capi"},
			Data: map[string][]byte{"value": kube.Kubeconfig}}, metav1.CreateOptions{})
		must("create Secret "+name+"-kubeconfig", nil, err)
	}
	policy := &clusterv1.ImportPolicy{
		Name:   "capi",
		Source: &clusterv1.ImportSource{Cluster: "eu-1", Group: "cluster.x-k8s.io", Resource: "clusters"},
		References: []*clusterv1.ImportReference{{Key: "kubeconfig", Version: "v1", Resource: "secrets",
			NamespaceTemplate: "{{ .source.metadata.namespace }}", NameTemplate: "{{ .source.metadata.name }}-kubeconfig"}},
		NameTemplate:      "{{ .source.metadata.name }}",
		Template:          "labels:\n  provider: capi\ncredentials:\n  kubeconfig: \"{{ .references.kubeconfig.data.value }}\"\n",
		CreationCondition: `{{ range .source.status.conditions }}{{ if and (eq .type "Ready") (eq .status "True") }}true{{ end }}{{ end }}`,
	}
	_, err = policies.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: policy}))
	must("create import policy", nil, err)
	policy.Template = "labels:\n  provider: capi\n  imported: \"true\"\ncredentials:\n  kubeconfig: \"{{ .references.kubeconfig.data.value }}\"\n"
	_, err = policies.UpdateImportPolicy(ctx, connect.NewRequest(&clusterv1.UpdateImportPolicyRequest{Policy: policy}))
	must("update import policy", nil, err)
	lifecycles := func() (map[string]clusterv1.ImportMode, error) {
		res, err := policies.ListImportLifecycles(ctx, connect.NewRequest(&clusterv1.ListImportLifecyclesRequest{Policy: "capi"}))
		if err != nil {
			return nil, err
		}
		out := map[string]clusterv1.ImportMode{}
		for _, lc := range res.Msg.Lifecycles {
			out[lc.Source.Name] = lc.Mode
		}
		return out, nil
	}
	testkit.Eventually(t, 60*time.Second, func() error {
		lcs, err := lifecycles()
		if err != nil {
			return err
		}
		if lcs["alpha"] != clusterv1.ImportMode_IMPORT_MODE_CREATED || lcs["gamma"] != clusterv1.ImportMode_IMPORT_MODE_CREATED ||
			lcs["eu-2"] != clusterv1.ImportMode_IMPORT_MODE_ADOPTED {
			return fmt.Errorf("lifecycles %v", lcs)
		}
		return nil
	})
	must("delete CAPI Cluster gamma", nil, capi.Delete(ctx, "gamma", metav1.DeleteOptions{}))
	testkit.Eventually(t, 60*time.Second, func() error {
		if _, err := clusters.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "gamma"})); connect.CodeOf(err) != connect.CodeNotFound {
			return fmt.Errorf("gamma still there (%v)", err)
		}
		return nil
	})

	policy = proto.CloneOf(policy)
	policy.Name, policy.Source.Cluster, policy.Source.Resource = "retired", "mgmt", "machinepools"
	_, err = policies.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: policy}))
	must("create import policy retired", nil, err)
	_, err = policies.DeleteImportPolicy(ctx, connect.NewRequest(&clusterv1.DeleteImportPolicyRequest{Name: "retired"}))
	must("delete import policy retired", nil, err)
	for _, s := range []string{"audit-export", "old-export"} {
		res, err := subscribers.CreateSubscriber(ctx, connect.NewRequest(&clusterv1.CreateSubscriberRequest{Name: s, Streams: []string{subjects.ClusterStream, subjects.NamespaceStream}}))
		must("create subscriber "+s, nil, err)
		fx.SubscriberTokens[s] = res.Msg.Token
	}
	_, err = subscribers.DeleteSubscriber(ctx, connect.NewRequest(&clusterv1.DeleteSubscriberRequest{Name: "old-export"}))
	must("delete subscriber old-export", nil, err)
	delete(fx.SubscriberTokens, "old-export")
	// Service web/api on eu-1, where the agent created namespace web.
	testkit.Eventually(t, 30*time.Second, func() error {
		_, err := kube.Client.CoreV1().Namespaces().Get(ctx, "web", metav1.GetOptions{})
		return err
	})
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "api-abcde", Namespace: "web",
		Labels: map[string]string{discoveryv1.LabelServiceName: "api"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo[int32](8080), Protocol: ptrTo(corev1.ProtocolTCP)}}}
	for _, ip := range []string{"10.0.2.1", "10.0.2.2"} {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Zone: ptrTo("eu-1a"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true), Serving: ptrTo(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "web", Name: "api-" + ip, UID: types.UID("uid-" + ip)}})
	}
	_, err = kube.Client.DiscoveryV1().EndpointSlices("web").Create(ctx, slice, metav1.CreateOptions{})
	must("create EndpointSlice web/api-abcde on eu-1", nil, err)
	testkit.Eventually(t, 30*time.Second, func() error {
		_, err := endpoints.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{Namespace: "web", Name: "api", Ip: "10.0.2.1", Weight: 40}))
		return err
	})
	_, err = endpoints.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{Namespace: "web", Name: "api", Ip: "10.0.2.2", Weight: 60}))
	must("endpoint weight", nil, err)
	_, err = endpoints.SetEndpointWeight(ctx, connect.NewRequest(&endpointv1.SetEndpointWeightRequest{Namespace: "web", Name: "api", Ip: "10.0.2.2", Clear: true}))
	must("clear endpoint weight", nil, err)
	_, err = endpoints.SetClusterWeight(ctx, connect.NewRequest(&endpointv1.SetClusterWeightRequest{Namespace: "web", Name: "api", Cluster: "eu-1", Weight: 1000}))
	must("cluster weight", nil, err)

	// The agent has applied what is bound to eu-1 (and deleted the unbound namespace), then
	// goes away.
	testkit.Eventually(t, 60*time.Second, func() error {
		for _, p := range []string{"team-a", "team-b"} {
			res, err := projects.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: p, Cluster: "eu-1"}))
			if err != nil {
				return err
			}
			for _, b := range res.Msg.Bindings {
				if b.Phase != projectv1.BindingPhase_BINDING_PHASE_AVAILABLE {
					return fmt.Errorf("binding %s/%s/%s is %v", p, b.Cluster, b.Namespace, b.Phase)
				}
			}
		}
		return nil
	})
	fx.finish()
	res, err := clusters.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	must("list clusters", nil, err)
	for _, c := range res.Msg.Clusters {
		if c.GetStatus().GetCredentialsSet() {
			fx.SealedClusters++
		}
	}
	return fx
}

func ptrTo[T any](v T) *T { return &v }

// waitSettled waits until what the scenario set off has happened: eu-1's agent lost after its
// heartbeat, every view caught up, the audit index holding every event, and the hub quiet (two
// reads of every list a second apart equal).
func waitSettled(t *testing.T, ctx context.Context, inst *fleetd.Instance) {
	t.Helper()
	clusters := clusterv1connect.NewClusterServiceClient(http.DefaultClient, "http://"+inst.Addr)
	testkit.Eventually(t, 30*time.Second, func() error {
		res, err := clusters.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "eu-1"}))
		if err != nil {
			return err
		}
		st := res.Msg.Cluster.GetStatus()
		if st.GetLastSeen() == nil || st.GetResources() == nil {
			return fmt.Errorf("eu-1's heartbeat not recorded yet: %v", st)
		}
		if !slices.ContainsFunc(res.Msg.Cluster.Taints, func(t *clusterv1.Taint) bool { return strings.Contains(t.Key, "unreachable") }) {
			return fmt.Errorf("eu-1 not lost yet: taints %v", res.Msg.Cluster.Taints)
		}
		return nil
	})
	testkit.WaitProjected(t, inst.JS, upgradeProjections()...)
	var last map[string]json.RawMessage
	testkit.Eventually(t, 30*time.Second, func() error {
		cur := map[string]json.RawMessage{}
		for k, m := range upgradeLists(t, ctx, "http://"+inst.Addr) {
			cur[k] = marshalStable(t, m)
		}
		prev := last
		last = cur
		if !reflect.DeepEqual(prev, cur) {
			time.Sleep(time.Second)
			return errors.New("the lists still change")
		}
		return nil
	})
}

// upgradeLists asks every List (and Get of what has no List) the fixture's history shows in,
// by a stable name: what the fixture records, and what the upgraded hub is compared on.
func upgradeLists(t *testing.T, ctx context.Context, base string) map[string]proto.Message {
	t.Helper()
	clusters := clusterv1connect.NewClusterServiceClient(http.DefaultClient, base)
	policies := clusterv1connect.NewImportPolicyServiceClient(http.DefaultClient, base)
	subscribers := clusterv1connect.NewSubscriberServiceClient(http.DefaultClient, base)
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, base)
	rbac := rbacv1connect.NewRBACServiceClient(http.DefaultClient, base)
	sets := placementv1connect.NewClusterSetServiceClient(http.DefaultClient, base)
	placements := placementv1connect.NewPlacementServiceClient(http.DefaultClient, base)
	endpoints := endpointv1connect.NewEndpointServiceClient(http.DefaultClient, base)
	audit := auditv1connect.NewAuditServiceClient(http.DefaultClient, base)
	out := map[string]proto.Message{}
	add := func(name string, m proto.Message, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = m
	}
	msg := func(r interface{ Any() any }) proto.Message { return r.Any().(proto.Message) }
	call := func(name string, f func() (interface{ Any() any }, error)) {
		t.Helper()
		r, err := f()
		if err != nil {
			add(name, nil, err)
			return
		}
		add(name, msg(r), nil)
	}
	call("ListClusters", func() (interface{ Any() any }, error) {
		return clusters.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	})
	call("ListImportPolicies", func() (interface{ Any() any }, error) {
		return policies.ListImportPolicies(ctx, connect.NewRequest(&clusterv1.ListImportPoliciesRequest{}))
	})
	call("ListImportLifecycles/capi", func() (interface{ Any() any }, error) {
		return policies.ListImportLifecycles(ctx, connect.NewRequest(&clusterv1.ListImportLifecyclesRequest{Policy: "capi"}))
	})
	call("ListSubscribers", func() (interface{ Any() any }, error) {
		return subscribers.ListSubscribers(ctx, connect.NewRequest(&clusterv1.ListSubscribersRequest{}))
	})
	call("ListProjects", func() (interface{ Any() any }, error) {
		return projects.ListProjects(ctx, connect.NewRequest(&projectv1.ListProjectsRequest{}))
	})
	call("ListRoleTemplates", func() (interface{ Any() any }, error) {
		return rbac.ListRoleTemplates(ctx, connect.NewRequest(&rbacv1.ListRoleTemplatesRequest{}))
	})
	call("ListClusterSets", func() (interface{ Any() any }, error) {
		return sets.ListClusterSets(ctx, connect.NewRequest(&placementv1.ListClusterSetsRequest{}))
	})
	call("ListClusterSetRoleBindings", func() (interface{ Any() any }, error) {
		return sets.ListClusterSetRoleBindings(ctx, connect.NewRequest(&placementv1.ListClusterSetRoleBindingsRequest{}))
	})
	for _, p := range []string{"team-a", "team-b"} {
		call("ListNamespaceBindings/"+p, func() (interface{ Any() any }, error) {
			return projects.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: p}))
		})
		call("ListProjectRoleBindings/"+p, func() (interface{ Any() any }, error) {
			return rbac.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: p}))
		})
		call("ListClusterSetBindings/"+p, func() (interface{ Any() any }, error) {
			return sets.ListClusterSetBindings(ctx, connect.NewRequest(&placementv1.ListClusterSetBindingsRequest{Project: p}))
		})
		call("ListPlacements/"+p, func() (interface{ Any() any }, error) {
			return placements.ListPlacements(ctx, connect.NewRequest(&placementv1.ListPlacementsRequest{Project: p}))
		})
	}
	for _, p := range []string{"eu-web", "everywhere"} {
		call("GetPlacementDecisions/team-a/"+p, func() (interface{ Any() any }, error) {
			return placements.GetPlacementDecisions(ctx, connect.NewRequest(&placementv1.GetPlacementDecisionsRequest{Project: "team-a", Name: p}))
		})
	}
	call("ListServiceWeights/web", func() (interface{ Any() any }, error) {
		return endpoints.ListServiceWeights(ctx, connect.NewRequest(&endpointv1.ListServiceWeightsRequest{Namespace: "web"}))
	})
	call("ListActivity", func() (interface{ Any() any }, error) {
		return audit.ListActivity(ctx, connect.NewRequest(&auditv1.ListActivityRequest{PageSize: 1000}))
	})
	return out
}

func upgradeProjections() []view.Projection {
	return slices.Concat(clusterimport.Projections(), namespacebinding.Projections(), rbacsync.Projections(), collector.Projections())
}

// verifyViews checks every view of inst against its rebuild from the streams.
func verifyViews(t *testing.T, ctx context.Context, inst *fleetd.Instance, when string) {
	t.Helper()
	for _, p := range upgradeProjections() {
		v, err := view.Verify(ctx, inst.JS, p)
		if err != nil {
			t.Fatalf("verify view %s %s: %v", p.Name, when, err)
		}
		if !v.Equal() {
			t.Errorf("view %s %s differs from its rebuild: %d mismatches, first %+v", p.Name, when, len(v.Mismatches), v.Mismatches[0])
		}
	}
}

// liveState are the paths (indexes as [*]) of List answers that are not read from the stored
// history but recomputed after each start from what agents report live, which a restored
// fixture has no agent to report: an import lifecycle's conditions and render time, and an
// import policy's conditions, need the source cluster's agent to resend the referenced Secrets
// (never stored) and read "not reported by the agent yet" until it does. The lifecycles
// themselves (mode, source, cluster) and the policies' counts are compared.
var liveState = []string{
	"ListImportPolicies.policies[*].status.conditions",
	"ListImportLifecycles/capi.lifecycles[*].conditions",
	"ListImportLifecycles/capi.lifecycles[*].lastRenderTime",
}

var indexRE = regexp.MustCompile(`\[[0-9]+\]`)

// jsonSubset reports where have lacks what want holds: every object key of want present in
// have with a value that holds want's (have may hold more keys: fields added since), every
// array of the same length with each element holding want's (so an empty list recorded must
// be empty), an empty object recorded (an empty map) empty, every other value equal; paths in
// liveState are not compared. A null recorded (a message field N−1 left unset) claims nothing:
// a later version may fill it in.
func jsonSubset(path string, want, have any) []string {
	if slices.Contains(liveState, indexRE.ReplaceAllString(path, "[*]")) {
		return nil
	}
	switch w := want.(type) {
	case nil:
		return nil
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: want an object %v, got %v", path, abbrev(want), abbrev(have))}
		}
		if len(w) == 0 && len(h) != 0 {
			return []string{fmt.Sprintf("%s: want an empty object, got %v", path, abbrev(have))}
		}
		var out []string
		for _, k := range slices.Sorted(mapKeys(w)) {
			hv, ok := h[k]
			if !ok {
				out = append(out, fmt.Sprintf("%s.%s: missing, want %v", path, k, abbrev(w[k])))
				continue
			}
			out = append(out, jsonSubset(path+"."+k, w[k], hv)...)
		}
		return out
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			return []string{fmt.Sprintf("%s: want %d entries %v, got %v", path, len(w), abbrev(want), abbrev(have))}
		}
		var out []string
		for i := range w {
			out = append(out, jsonSubset(fmt.Sprintf("%s[%d]", path, i), w[i], h[i])...)
		}
		return out
	default:
		if !reflect.DeepEqual(want, have) {
			return []string{fmt.Sprintf("%s: want %v, got %v", path, abbrev(want), abbrev(have))}
		}
		return nil
	}
}

func abbrev(v any) string {
	data, _ := json.Marshal(v)
	if len(data) > 300 {
		return string(data[:300]) + "…"
	}
	return string(data)
}

// marshalStable is m as indented protobuf JSON with sorted keys: protojson's own output varies
// its spacing from build to build on purpose. Every field is written, the unpopulated too (an
// empty list as [], a zero as 0, an unset message as null): a field left out of expected.json
// would be compared with nothing, so an empty list recorded must be there to say "empty".
func marshalStable(t *testing.T, m proto.Message) json.RawMessage {
	t.Helper()
	data, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// backupEventTypes counts the envelope types in the backup's domain event streams.
func backupEventTypes(t *testing.T, dir string) map[string]int {
	t.Helper()
	out := map[string]int{}
	m, err := backup.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range m.Streams {
		if !strings.HasPrefix(s.Name, "FLEET_") || s.Name == subjects.AuditStream || s.Name == "FLEET_DLQ" {
			continue
		}
		f, err := os.Open(filepath.Join(dir, backup.StreamsDir, s.Name, jsm.SnapshotDataFile))
		if err != nil {
			t.Fatal(err)
		}
		dec := jsmbackup.NewDecoder(f)
		for {
			item, err := dec.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", s.Name, err)
			}
			msg, ok := item.(*jsmbackup.Message)
			if !ok {
				continue
			}
			body, err := io.ReadAll(msg.Body)
			if err != nil {
				t.Fatal(err)
			}
			var env eventv1.Envelope
			if msg.HdrSize > int64(len(body)) || proto.Unmarshal(body[msg.HdrSize:], &env) != nil || env.Type == "" {
				out[s.Name+" (not an envelope)"]++
				continue
			}
			out[env.Type]++
		}
		_ = f.Close()
	}
	return out
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !yield(k) {
				return
			}
		}
	}
}
