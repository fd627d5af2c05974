package collector

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/authz"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// tenancy is a collector behind real authentication (bearer tokens) and the real authorizer,
// whose role templates, project role bindings and namespace bindings are written straight into
// the views rbac-sync and namespace-binding own.
type tenancy struct {
	*harness
	nsb     jetstream.KeyValue
	clients map[string]endpointv1connect.EndpointServiceClient
}

// startTenancy starts it with owners[user] = project (each user owns one project), root as the
// platform admin, and bindings "cluster/namespace" → project.
func startTenancy(t *testing.T, js jetstream.JetStream, owners map[string]string, bindings map[string]string) *tenancy {
	t.Helper()
	ctx := testkit.Context(t, 30*time.Second)
	create := func(bucket string) jetstream.KeyValue {
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
		if err != nil {
			t.Fatal(err)
		}
		return kv
	}
	put := func(kv jetstream.KeyValue, key string, m proto.Message) {
		data, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	templates, rb := create(subjects.RBACTemplatesBucket), create(subjects.RBACBindingsBucket)
	te := &tenancy{nsb: create(subjects.NamespaceBindingsBucket), clients: map[string]endpointv1connect.EndpointServiceClient{}}
	for _, b := range roles.Builtin() {
		put(templates, keys.Encode(b.Name), b)
	}
	tokens := "root-token,root\n"
	for user, project := range owners {
		put(rb, user+"-"+project, &rbacv1.ProjectRoleBinding{Project: project, RoleTemplate: roles.ProjectOwner,
			Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: user}})
		tokens += user + "-token," + user + "\n"
	}
	for where, project := range bindings {
		te.bind(t, where, project)
	}
	tokenFile := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokenFile, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}

	rctx, cancel := context.WithCancel(context.Background())
	c, err := New(rctx, js, Config{}, testkit.Logger(t))
	if err != nil {
		cancel()
		t.Fatalf("new collector: %v", err)
	}
	srv, err := server.New(server.Config{TokenFile: tokenFile}, testkit.Logger(t))
	if err != nil {
		cancel()
		t.Fatalf("server: %v", err)
	}
	az := testkit.Authorize(t, js, srv, authz.Config{PlatformAdmins: []string{"root"}})
	c.UseOwnership(az)
	c.Mount(srv)
	h := &harness{t: t, js: js, c: c, http: httptest.NewServer(srv.Handler()), cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- c.Run(rctx) }()
	select {
	case <-c.Ready():
	case err := <-h.done:
		t.Fatalf("collector stopped before ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("collector not ready")
	}
	t.Cleanup(h.stop)
	te.harness = h
	users := []string{"root"}
	for u := range owners {
		users = append(users, u)
	}
	for _, user := range users {
		te.clients[user] = endpointv1connect.NewEndpointServiceClient(&http.Client{Transport: bearer(user + "-token")}, h.http.URL)
	}
	h.client = te.clients["root"]
	return te
}

type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// bind makes project own namespace on cluster ("cluster/namespace"); "" unbinds.
func (te *tenancy) bind(t *testing.T, where, project string) {
	t.Helper()
	cluster, ns, _ := cutSlash(where)
	ctx := testkit.Context(t, 10*time.Second)
	if project == "" {
		if err := te.nsb.Delete(ctx, keys.Join(cluster, ns)); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := proto.Marshal(&projectv1.NamespaceBinding{Project: project, Cluster: cluster, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := te.nsb.Put(ctx, keys.Join(cluster, ns), data); err != nil {
		t.Fatal(err)
	}
}

func cutSlash(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// view renders what user reads as ns/name: summarize's form, "<none>", or the error's code.
func (te *tenancy) view(user, ns, name string) string {
	res, err := te.clients[user].GetServiceEndpoints(context.Background(), connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{
		Namespace: ns, Name: name, Filter: all}))
	switch {
	case connect.CodeOf(err) == connect.CodeNotFound:
		return "<none>"
	case err != nil:
		return connect.CodeOf(err).String()
	}
	return summarize(res.Msg.Clusters)
}

func (te *tenancy) eventuallySees(user, ns, name, want string) {
	te.t.Helper()
	testkit.Eventually(te.t, 10*time.Second, func() error {
		if got := te.view(user, ns, name); got != want {
			return fmt.Errorf("%s reads %s/%s:\n got %s\nwant %s", user, ns, name, got, want)
		}
		return nil
	})
}

func (te *tenancy) clusterWeight(user, ns, name, cluster string, w uint32) error {
	_, err := te.clients[user].SetClusterWeight(context.Background(), connect.NewRequest(&endpointv1.SetClusterWeightRequest{
		Namespace: ns, Name: name, Cluster: cluster, Weight: w}))
	return err
}

func (te *tenancy) endpointWeight(user, ns, name, ip, cluster string, w uint32) error {
	_, err := te.clients[user].SetEndpointWeight(context.Background(), connect.NewRequest(&endpointv1.SetEndpointWeightRequest{
		Namespace: ns, Name: name, Ip: ip, Cluster: cluster, Weight: w}))
	return err
}

var denied = connect.CodePermissionDenied.String()

func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
}

// Issue 25 item 4, the attack: team-a owns namespace web on c1, team-b owns web on c2, and
// both report web/api. Before, the collector merged both into one web/api: team-a's weight of
// 1,000 on c1 drew ~91% of the traffic team-b's proxies sent to its own web/api, and team-b's
// owner was refused its own service (the read needed rights in every project owning web).
// Now each project's service merges only its own clusters, and weights follow.
func TestOneProjectCannotSteerAnothersTraffic(t *testing.T) {
	js := testkit.StartJetStream(t)
	te := startTenancy(t, js.JS, map[string]string{"alice": "team-a", "bob": "team-b"},
		map[string]string{"c1/web": "team-a", "c2/web": "team-b"})
	c1, c2 := newFakeAgent(t, js.JS, "c1", ""), newFakeAgent(t, js.JS, "c2", "")
	c1.report("web", "api", "api-1", http8080, ep{ip: "10.1.0.1", conds: "RS"})
	c2.report("web", "api", "api-2", http8080, ep{ip: "10.2.0.1", conds: "RS"})

	te.eventuallySees("bob", "web", "api", "c2[10.2.0.1:8080]")
	te.eventuallySees("alice", "web", "api", "c1[10.1.0.1:8080]")
	te.eventuallySees("root", "web", "api", "c1[10.1.0.1:8080] c2[10.2.0.1:8080]") // admins read it whole

	// team-a weights its cluster at 1,000: its own service only.
	bobsVersion := func() uint64 {
		res, err := te.clients["bob"].GetServiceEndpoints(context.Background(), connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{
			Namespace: "web", Name: "api"}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.Version
	}
	before := bobsVersion()
	if err := te.clusterWeight("alice", "web", "api", "c1", 1000); err != nil {
		t.Fatalf("team-a weights its own cluster: %v", err)
	}
	te.eventuallySees("alice", "web", "api", "c1@1000[10.1.0.1:8080w1000]")
	if got := te.view("bob", "web", "api"); got != "c2[10.2.0.1:8080]" {
		t.Fatalf("team-b's web/api after team-a's weight: %s", got)
	}
	if after := bobsVersion(); after != before {
		t.Fatalf("team-a's weight changed team-b's service (version %d -> %d): its watchers would wake", before, after)
	}
	// Nor can team-a reach team-b's cluster or endpoints.
	wantCode(t, "team-a weights c2", te.clusterWeight("alice", "web", "api", "c2", 0), connect.CodePermissionDenied)
	wantCode(t, "team-a weights team-b's endpoint", te.endpointWeight("alice", "web", "api", "10.2.0.1", "", 0), connect.CodeNotFound)
	wantCode(t, "team-a weights team-b's endpoint in c2", te.endpointWeight("alice", "web", "api", "10.2.0.1", "c2", 0), connect.CodePermissionDenied)

	// team-b's owner reads and weights its own service.
	if err := te.endpointWeight("bob", "web", "api", "10.2.0.1", "", 50); err != nil {
		t.Fatalf("team-b weights its endpoint: %v", err)
	}
	te.eventuallySees("bob", "web", "api", "c2[10.2.0.1:8080w50]")
	te.eventuallySees("alice", "web", "api", "c1@1000[10.1.0.1:8080w1000]")

	// What proxies read fleet-wide (the xDS feed, bucket `endpoints`): one service per project.
	for _, tc := range []struct {
		ref  ServiceRef
		want string
	}{
		{ServiceRef{"web", "api", "team-a"}, "c1@1000[10.1.0.1:8080w1000]"},
		{ServiceRef{"web", "api", "team-b"}, "c2[10.2.0.1:8080w50]"},
		{ServiceRef{"web", "api", ""}, "<none>"},
	} {
		got := "<none>"
		if r, ok := te.c.ServiceEndpoints(tc.ref); ok {
			got = summarize(r.Clusters)
		}
		if got != tc.want {
			t.Errorf("feed's %+v: got %s, want %s", tc.ref, got, tc.want)
		}
	}
	f := te.c.Feed()
	defer f.Close()
	refs := f.Take()
	slices.SortFunc(refs, func(a, b ServiceRef) int { return cmpRef(a, b) })
	if want := []ServiceRef{{"web", "api", "team-a"}, {"web", "api", "team-b"}}; !slices.Equal(refs, want) {
		t.Errorf("feed serves %v, want %v", refs, want)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		kv, err := js.JS.KeyValue(context.Background(), subjects.EndpointsBucket)
		if err != nil {
			return err
		}
		for _, k := range []string{keys.Join("web", "api", "team-a"), keys.Join("web", "api", "team-b")} {
			if _, err := kv.Get(context.Background(), k); err != nil {
				return fmt.Errorf("bucket key %s: %w", k, err)
			}
		}
		if _, err := kv.Get(context.Background(), keys.Join("web", "api")); err == nil {
			return fmt.Errorf("bucket still has the merged web/api")
		}
		return nil
	})
}

func cmpRef(a, b ServiceRef) int {
	switch {
	case a.Namespace+"/"+a.Name+"@"+a.Project < b.Namespace+"/"+b.Name+"@"+b.Project:
		return -1
	case a == b:
		return 0
	}
	return 1
}

// A cluster reporting a namespace its agent's project does not own there (a compromised or
// misconfigured agent, or a namespace nobody bound on that cluster) is not merged into the
// service of the project owning the namespace elsewhere: platform admins see it, apart. A bind
// or unbind re-evaluates the merge without any new report.
func TestEndpointsFromAClusterWhereTheProjectDoesNotOwnTheNamespaceAreNotMerged(t *testing.T) {
	js := testkit.StartJetStream(t)
	te := startTenancy(t, js.JS, map[string]string{"carol": "team-p"}, map[string]string{"c1/x": "team-p"})
	c1, c3 := newFakeAgent(t, js.JS, "c1", ""), newFakeAgent(t, js.JS, "c3", "")
	c1.report("x", "db", "db-1", http8080, ep{ip: "10.1.0.3", conds: "RS"})
	c3.report("x", "db", "db-3", http8080, ep{ip: "10.3.0.3", conds: "RS"})

	te.eventuallySees("root", "x", "db", "c1[10.1.0.3:8080] c3[10.3.0.3:8080]")
	te.eventuallySees("carol", "x", "db", "c1[10.1.0.3:8080]")
	wantCode(t, "team-p weights c3", te.clusterWeight("carol", "x", "db", "c3", 1000), connect.CodePermissionDenied)
	if err := te.clusterWeight("root", "x", "db", "c3", 0); err != nil {
		t.Fatalf("an admin weights c3's part: %v", err)
	}
	list, err := te.clients["root"].ListServices(context.Background(), connect.NewRequest(&endpointv1.ListServicesRequest{}))
	if err != nil || len(list.Msg.Services) != 1 || !slices.Equal(list.Msg.Services[0].Clusters, []string{"c1", "c3"}) {
		t.Fatalf("admin's list: %v %v", list, err)
	}
	list, err = te.clients["carol"].ListServices(context.Background(), connect.NewRequest(&endpointv1.ListServicesRequest{}))
	if err != nil || len(list.Msg.Services) != 1 || !slices.Equal(list.Msg.Services[0].Clusters, []string{"c1"}) {
		t.Fatalf("team-p's list: %v %v", list, err)
	}

	// team-p binds x on c3: c3 joins its service (with the weight an admin set there).
	te.bind(t, "c3/x", "team-p")
	te.eventuallySees("carol", "x", "db", "c1[10.1.0.3:8080] c3@0[10.3.0.3:8080w0]")
	// And unbinds it on c1: c1 leaves.
	te.bind(t, "c1/x", "")
	te.eventuallySees("carol", "x", "db", "c3@0[10.3.0.3:8080w0]")
	// Unbound everywhere: merged across every cluster again, the platform's.
	te.bind(t, "c3/x", "")
	te.eventuallySees("carol", "x", "db", denied)
	te.eventuallySees("root", "x", "db", "c1[10.1.0.3:8080] c3@0[10.3.0.3:8080w0]")
	testkit.Eventually(t, 10*time.Second, func() error {
		if r, ok := te.c.ServiceEndpoints(ServiceRef{Namespace: "x", Name: "db"}); !ok || len(r.Clusters) != 2 {
			return fmt.Errorf("the feed's merged x/db: %v", r)
		}
		return nil
	})
}

// A namespace no project owns anywhere keeps the seed's merge across every cluster, and its
// weights are the platform's: a project owner (of another namespace) can neither read nor
// weight it.
func TestUnownedNamespaceMergesAcrossClustersAndIsThePlatforms(t *testing.T) {
	js := testkit.StartJetStream(t)
	te := startTenancy(t, js.JS, map[string]string{"alice": "team-a"}, map[string]string{"c1/web": "team-a"})
	c1, c2 := newFakeAgent(t, js.JS, "c1", ""), newFakeAgent(t, js.JS, "c2", "")
	c1.report("shop", "cart", "cart-1", http8080, ep{ip: "10.1.0.9", conds: "RS"})
	c2.report("shop", "cart", "cart-2", http8080, ep{ip: "10.2.0.9", conds: "RS"})
	te.eventuallySees("root", "shop", "cart", "c1[10.1.0.9:8080] c2[10.2.0.9:8080]")
	if got := te.view("alice", "shop", "cart"); got != denied {
		t.Fatalf("a project owner reads an unowned namespace's service: %s", got)
	}
	wantCode(t, "a project owner weights an unowned namespace's cluster", te.clusterWeight("alice", "shop", "cart", "c1", 1000), connect.CodePermissionDenied)
	wantCode(t, "a project owner weights an unowned namespace's endpoint", te.endpointWeight("alice", "shop", "cart", "10.1.0.9", "", 1000), connect.CodePermissionDenied)
	if err := te.clusterWeight("root", "shop", "cart", "c1", 300); err != nil {
		t.Fatalf("an admin weights it: %v", err)
	}
	te.eventuallySees("root", "shop", "cart", "c1@300[10.1.0.9:8080w300] c2[10.2.0.9:8080]")
}

// ListServiceWeights (what `fleetctl export` declares as ServiceWeights) shows each caller the
// weights of the clusters where it may read the service, nothing of another project's: team-a
// owns web on c1, team-b on c2, both weight web/api. An admin sees both, with weights of
// services that have no endpoint yet (a cluster drained before it joins).
func TestServiceWeightsAreListedPerOwningProject(t *testing.T) {
	js := testkit.StartJetStream(t)
	te := startTenancy(t, js.JS, map[string]string{"alice": "team-a", "bob": "team-b"},
		map[string]string{"c1/web": "team-a", "c2/web": "team-b"})
	c1, c2 := newFakeAgent(t, js.JS, "c1", ""), newFakeAgent(t, js.JS, "c2", "")
	c1.report("web", "api", "api-1", http8080, ep{ip: "10.1.0.1", conds: "RS"})
	c2.report("web", "api", "api-2", http8080, ep{ip: "10.2.0.1", conds: "RS"})
	te.eventuallySees("root", "web", "api", "c1[10.1.0.1:8080] c2[10.2.0.1:8080]")

	if err := te.clusterWeight("alice", "web", "api", "c1", 300); err != nil {
		t.Fatal(err)
	}
	if err := te.endpointWeight("bob", "web", "api", "10.2.0.1", "c2", 0); err != nil {
		t.Fatal(err)
	}
	if err := te.clusterWeight("bob", "web", "api", "c2", 20); err != nil {
		t.Fatal(err)
	}
	if err := te.clusterWeight("root", "web", "cart", "c3", 0); err != nil { // no endpoints anywhere yet
		t.Fatal(err)
	}
	if err := te.clusterWeight("alice", "web", "api", "c1", 100); err == nil { // back to the default: not listed
		if err := te.clusterWeight("alice", "web", "api", "c1", 300); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Fatal(err)
	}
	list := func(user, ns string) string {
		res, err := te.clients[user].ListServiceWeights(context.Background(), connect.NewRequest(&endpointv1.ListServiceWeightsRequest{Namespace: ns}))
		if err != nil {
			return connect.CodeOf(err).String()
		}
		var out []string
		for _, w := range res.Msg.Weights {
			s := w.Namespace + "/" + w.Name + ":"
			for _, c := range slices.Sorted(maps.Keys(w.ClusterWeights)) {
				s += fmt.Sprintf(" %s=%d", c, w.ClusterWeights[c])
			}
			for _, e := range w.EndpointWeights {
				s += fmt.Sprintf(" %s/%s=%d", e.ClusterName, e.Ip, e.Weight)
			}
			out = append(out, s)
		}
		return strings.Join(out, "; ")
	}
	// Setting a weight answers with the service's weights, which are as much another project's:
	// bob re-sets his own cluster's weight and reads back nothing of team-a's.
	res, err := te.clients["bob"].SetClusterWeight(context.Background(), connect.NewRequest(&endpointv1.SetClusterWeightRequest{
		Namespace: "web", Name: "api", Cluster: "c2", Weight: 20}))
	if err != nil {
		t.Fatal(err)
	}
	if w := res.Msg.Weights; fmt.Sprint(w.ClusterWeights) != "map[c2:20]" || len(w.EndpointWeights) != 1 || w.Revision != 0 {
		t.Errorf("bob's SetClusterWeight answers %v", w)
	}
	for _, tc := range []struct{ user, ns, want string }{
		{"root", "", "web/api: c1=300 c2=20 c2/10.2.0.1=0; web/cart: c3=0"},
		{"alice", "", "web/api: c1=300"},
		{"bob", "web", "web/api: c2=20 c2/10.2.0.1=0"},
		{"root", "other", ""},
		{"root", "Not_A_Label", connect.CodeInvalidArgument.String()},
	} {
		if got := list(tc.user, tc.ns); got != tc.want {
			t.Errorf("%s lists %q: got %q, want %q", tc.user, tc.ns, got, tc.want)
		}
	}
}
