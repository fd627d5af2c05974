package chaos

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/paging"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// CheckWrites compares what the API serves with what the ledger says must hold and returns one
// line per difference (empty: every acknowledged write is there, every acknowledged removal is
// gone).
func CheckWrites(ctx context.Context, c Clients, ex Expected, weights map[uint32]bool) ([]string, error) {
	var diffs []string
	bs, err := loadBindings(ctx, c)
	if err != nil {
		return nil, err
	}
	bound := map[string]projectv1.BindingPhase{}
	for _, b := range bs {
		bound[b.GetCluster()+"/"+b.GetNamespace()] = b.GetPhase()
	}
	for key, want := range ex.Bound {
		phase, got := bound[key]
		switch {
		case want && !got:
			diffs = append(diffs, fmt.Sprintf("binding %s: acknowledged, missing", key))
		case want && phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING:
			diffs = append(diffs, fmt.Sprintf("binding %s: acknowledged, but terminating", key))
		case !want && got && phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING:
			// Terminating is the unbind recorded: the compose members run no namespace
			// controller, so a deleted namespace never finishes terminating there.
			diffs = append(diffs, fmt.Sprintf("binding %s: unbind acknowledged, still there (%s)", key, phase))
		}
	}
	rbs, err := loadGrants(ctx, c)
	if err != nil {
		return nil, err
	}
	granted := map[string]bool{}
	for _, b := range rbs {
		granted[b.GetSubject().GetName()] = true
	}
	for user, want := range ex.Granted {
		if want != granted[user] {
			diffs = append(diffs, fmt.Sprintf("grant %s: acknowledged %v, served %v", user, want, granted[user]))
		}
	}
	if len(ex.Weights) > 0 && weights != nil {
		found := false
		var got []uint32
		for w := range weights {
			got = append(got, w)
			if ex.Weights[w] {
				found = true
			}
		}
		if !found {
			diffs = append(diffs, fmt.Sprintf("weight of %s/%s on %s: served %v, acknowledged %v", WeightNamespace, WeightService, WeightCluster, got, keysOf(ex.Weights)))
		}
	}
	sort.Strings(diffs)
	return diffs, nil
}

func keysOf(m map[uint32]bool) []uint32 {
	var out []uint32
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// ServiceViews are the views of each hub service, with the NATS credentials that may read them.
type ServiceViews struct {
	Service     string
	User        string // NATS user name (cluster-import's static user), empty for a token
	SecretFile  string // under .data/compose/nats
	Projections []view.Projection
}

// AllViews lists every view of the hub.
func AllViews() []ServiceViews {
	return []ServiceViews{
		{Service: "cluster-import", User: "cluster-import", SecretFile: "nats/cluster-import.password", Projections: clusterimport.Projections()},
		{Service: "namespace-binding", SecretFile: "nats/namespace-binding.token", Projections: namespacebinding.Projections()},
		{Service: "rbac-sync", SecretFile: "nats/rbac-sync.token", Projections: rbacsync.Projections()},
		{Service: "endpoint-collector", SecretFile: "nats/endpoint-collector.token", Projections: collector.Projections()},
	}
}

// Connect opens a NATS connection as a hub service.
func (s *Stack) Connect(sv ServiceViews) (*nats.Conn, jetstream.JetStream, error) {
	secret, err := s.Secret(sv.SecretFile)
	if err != nil {
		return nil, nil, err
	}
	opt := nats.Token(secret)
	if sv.User != "" {
		opt = nats.UserInfo(sv.User, secret)
	}
	urls := s.NATSURL
	if s.NATSURLs != "" {
		urls = s.NATSURLs
	}
	nc, err := nats.Connect(urls, opt, nats.Name("chaos-check-"+sv.Service),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(sv.Service)))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS as %s: %w", sv.Service, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// VerifyViews checks every view of the hub against a rebuild from its stream and returns the
// verifications and one line per mismatch.
func (s *Stack) VerifyViews(ctx context.Context) ([]view.Verification, []string, error) {
	var all []view.Verification
	var diffs []string
	for _, sv := range AllViews() {
		nc, js, err := s.Connect(sv)
		if err != nil {
			return nil, nil, err
		}
		for _, p := range sv.Projections {
			v, err := view.Verify(ctx, js, p)
			if err != nil {
				nc.Close()
				return nil, nil, fmt.Errorf("%s: %w", sv.Service, err)
			}
			all = append(all, v)
			for _, m := range v.Mismatches {
				diffs = append(diffs, fmt.Sprintf("view %s key %s: bucket %q, rebuild %q", v.View, m.Key, oneLine(m.Got), oneLine(m.Want)))
			}
		}
		nc.Close()
	}
	return all, diffs, nil
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// Weights reads the cluster weight of the load's service from the endpoint-weights view.
func (s *Stack) Weights(ctx context.Context) (map[uint32]bool, error) {
	nc, js, err := s.Connect(AllViews()[3])
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	kv, err := js.KeyValue(ctx, subjects.EndpointWeightsBucket)
	if err != nil {
		return nil, err
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	out := map[uint32]bool{}
	for {
		// The watcher uses ctx only while it is created: without the select, a marker of the
		// initial values that never arrives would keep this loop waiting forever.
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read %s: %w", subjects.EndpointWeightsBucket, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("read %s: watch closed", subjects.EndpointWeightsBucket)
			}
			if e == nil { // initial values done
				if len(out) == 0 {
					// No entry: the service has no override anywhere (a weight set back to the
					// default deletes the entry), so it is served with the default.
					out[100] = true
				}
				return out, nil
			}
			sw := &endpointv1.ServiceWeights{}
			if proto.Unmarshal(e.Value(), sw) != nil || sw.GetNamespace() != WeightNamespace || sw.GetName() != WeightService {
				continue
			}
			if v, ok := sw.GetClusterWeights()[WeightCluster]; ok {
				out[v] = true
			} else {
				out[100] = true // no override: the default
			}
		}
	}
}

// Member is a member cluster seen with its admin kubeconfig.
type Member struct {
	Name string
	Kube kubernetes.Interface
}

// Members opens the admin connections of the compose stack's member clusters.
func (s *Stack) Members(names ...string) ([]Member, error) {
	var out []Member
	for _, n := range names {
		cfg, err := clientcmd.BuildConfigFromFlags("", s.Root+"/.data/compose/members/"+n+"/admin.kubeconfig")
		if err != nil {
			return nil, fmt.Errorf("member %s: %w", n, err)
		}
		// One SubjectAccessReview per user the load touched, hundreds per check: client-go's
		// default 5 QPS would make the check slower than what it checks.
		cfg.QPS, cfg.Burst = 500, 1000
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		out = append(out, Member{Name: n, Kube: kc})
	}
	return out, nil
}

// CheckAccess asks the member's own authorizer whether each user of ex may create Deployments in
// the RBAC project's namespace, and lists the RoleBindings there that bind a user whose grant
// was revoked (stale). It returns one line per difference and the number of stale RoleBindings.
func CheckAccess(ctx context.Context, m Member, ex Expected) ([]string, int, error) {
	var diffs []string
	users := make([]string, 0, len(ex.Granted))
	for u := range ex.Granted {
		users = append(users, u)
	}
	sort.Strings(users)
	for _, u := range users {
		sar, err := m.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: u, ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: RBACNamespace, Verb: "create", Group: "apps", Resource: "deployments"}},
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, 0, fmt.Errorf("%s: SubjectAccessReview for %s: %w", m.Name, u, err)
		}
		if sar.Status.Allowed != ex.Granted[u] {
			diffs = append(diffs, fmt.Sprintf("%s: %s may create deployments in %s: %v, want %v", m.Name, u, RBACNamespace, sar.Status.Allowed, ex.Granted[u]))
		}
	}
	rbs, err := m.Kube.RbacV1().RoleBindings(RBACNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("%s: list RoleBindings: %w", m.Name, err)
	}
	stale := 0
	for _, rb := range rbs.Items {
		for _, s := range rb.Subjects {
			if s.Kind == "User" && strings.HasPrefix(s.Name, "u-") {
				if g, known := ex.Granted[s.Name]; known && !g {
					stale++
					diffs = append(diffs, fmt.Sprintf("%s: stale RoleBinding %s binds revoked %s", m.Name, rb.Name, s.Name))
				}
			}
		}
	}
	return diffs, stale, nil
}

// loadBindings is every namespace binding of the load's project, page after page (the server
// pages the list; a check of the first page alone would call the rest lost).
func loadBindings(ctx context.Context, c Clients) ([]*projectv1.NamespaceBinding, error) {
	var out []*projectv1.NamespaceBinding
	req := &projectv1.ListNamespaceBindingsRequest{Project: NSProject}
	err := paging.All(func(token string) (string, error) {
		req.PageToken = token
		res, err := c.Project.ListNamespaceBindings(ctx, connect.NewRequest(req))
		if err != nil {
			return "", err
		}
		out = append(out, res.Msg.GetBindings()...)
		return res.Msg.GetNextPageToken(), nil
	})
	if err != nil {
		return nil, fmt.Errorf("list bindings of %s: %w", NSProject, err)
	}
	return out, nil
}

// loadGrants is every project role binding of the load's project and template, page after page.
func loadGrants(ctx context.Context, c Clients) ([]*rbacv1.ProjectRoleBinding, error) {
	var out []*rbacv1.ProjectRoleBinding
	req := &rbacv1.ListProjectRoleBindingsRequest{Project: RBACProject, RoleTemplate: RoleTemplate}
	err := paging.All(func(token string) (string, error) {
		req.PageToken = token
		res, err := c.RBAC.ListProjectRoleBindings(ctx, connect.NewRequest(req))
		if err != nil {
			return "", err
		}
		out = append(out, res.Msg.GetBindings()...)
		return res.Msg.GetNextPageToken(), nil
	})
	if err != nil {
		return nil, fmt.Errorf("list role bindings of %s: %w", RBACProject, err)
	}
	return out, nil
}
