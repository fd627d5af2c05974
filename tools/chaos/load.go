package chaos

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
)

// The load's objects: namespaces of project NSProject are bound and unbound on both clusters;
// users are granted and revoked RoleTemplate in project RBACProject, whose namespace
// RBACNamespace is bound on every cluster; the weight of WeightCluster for service
// WeightNamespace/WeightService is set over and over.
const (
	NSProject       = "chaos-ns"
	RBACProject     = "chaos-rbac"
	RBACNamespace   = "chaos-rbac"
	RoleTemplate    = "chaos-deployer"
	WeightNamespace = "chaos"
	WeightService   = "web"
	WeightCluster   = "east"
)

// Clients are the API clients of the load and the checks, through the gateway.
type Clients struct {
	Project  projectv1connect.ProjectServiceClient
	RBAC     rbacv1connect.RBACServiceClient
	Endpoint endpointv1connect.EndpointServiceClient
}

// NewClients returns clients of the gateway at base that send token.
func NewClients(base, token string) Clients {
	hc := &http.Client{Timeout: 30 * time.Second}
	auth := bearer(token)
	return Clients{
		Project:  projectv1connect.NewProjectServiceClient(hc, base, auth),
		RBAC:     rbacv1connect.NewRBACServiceClient(hc, base, auth),
		Endpoint: endpointv1connect.NewEndpointServiceClient(hc, base, auth),
	}
}

func bearer(token string) connect.ClientOption {
	return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	}))
}

// Outcome of one write as the client saw it.
type Outcome int

const (
	// Acked: the API answered OK, so the write must be there afterwards.
	Acked Outcome = iota
	// Refused: the API answered with an error other than a timeout or unavailability; the
	// write did not happen.
	Refused
	// Unknown: timed out or the connection failed; it may or may not have happened.
	Unknown
)

// Write is one API write of the load.
type Write struct {
	Kind          string // bind, unbind, grant, revoke, weight
	Key           string // cluster/namespace, user, or the weight's value
	Start, End    time.Time
	Outcome       Outcome
	Err           string
	WeightPayload uint32
}

// Ledger records every write of the load in the order they were sent (one at a time).
type Ledger struct {
	mu     sync.Mutex
	writes []Write
}

func (l *Ledger) add(w Write) {
	l.mu.Lock()
	l.writes = append(l.writes, w)
	l.mu.Unlock()
}

// Writes returns a copy of the record.
func (l *Ledger) Writes() []Write {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Write(nil), l.writes...)
}

// Expected is what the record says must hold: for every key whose last write with a known
// outcome was acknowledged and no write with an unknown outcome came after it.
type Expected struct {
	// Bound maps cluster/namespace to whether it must be bound (true) or must not (false).
	Bound map[string]bool
	// Granted maps a user to whether the grant must exist.
	Granted map[string]bool
	// Weights are the values the weight may have: the last acknowledged one and any sent later
	// with an unknown outcome.
	Weights map[uint32]bool
}

// Expect derives what must hold from the record.
func (l *Ledger) Expect() Expected {
	ex := Expected{Bound: map[string]bool{}, Granted: map[string]bool{}, Weights: map[uint32]bool{}}
	unsure := map[string]bool{}
	for _, w := range l.Writes() {
		key := w.Kind[:1] + w.Key
		switch w.Kind {
		case "bind", "unbind":
			key = "n" + w.Key
		case "grant", "revoke":
			key = "g" + w.Key
		}
		switch w.Outcome {
		case Unknown:
			unsure[key] = true
			if w.Kind == "weight" {
				ex.Weights[w.WeightPayload] = true
			}
		case Acked:
			unsure[key] = false
			switch w.Kind {
			case "bind":
				ex.Bound[w.Key] = true
			case "unbind":
				ex.Bound[w.Key] = false
			case "grant":
				ex.Granted[w.Key] = true
			case "revoke":
				ex.Granted[w.Key] = false
			case "weight":
				ex.Weights = map[uint32]bool{w.WeightPayload: true}
			}
		}
	}
	for key, u := range unsure {
		if !u {
			continue
		}
		switch key[0] {
		case 'n':
			delete(ex.Bound, key[1:])
		case 'g':
			delete(ex.Granted, key[1:])
		}
	}
	return ex
}

// Resume is how long after t the first write that started after t was acknowledged, and how
// many writes started after t failed before it. ok is false if none was.
func (l *Ledger) Resume(t time.Time) (d time.Duration, failed int, ok bool) {
	ws := l.Writes()
	sort.Slice(ws, func(i, j int) bool { return ws[i].Start.Before(ws[j].Start) })
	for _, w := range ws {
		if w.Start.Before(t) {
			continue
		}
		if w.Outcome == Acked {
			return w.End.Sub(t), failed, true
		}
		failed++
	}
	return 0, failed, false
}

// Counts returns how many writes had each outcome.
func (l *Ledger) Counts() (acked, refused, unknown int) {
	for _, w := range l.Writes() {
		switch w.Outcome {
		case Acked:
			acked++
		case Refused:
			refused++
		default:
			unknown++
		}
	}
	return
}

// Load sends a steady stream of writes, one at a time, until its context ends.
type Load struct {
	C       Clients
	Ledger  *Ledger
	Every   time.Duration // one round (bind, grant, weight and every other round an unbind and a revoke) per Every
	Timeout time.Duration // per write
	round   int
}

// Run sends rounds until ctx ends. Rounds continue numbering across calls, so every call
// writes new keys.
func (l *Load) Run(ctx context.Context) {
	t := time.NewTicker(l.Every)
	defer t.Stop()
	for {
		l.oneRound(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (l *Load) oneRound(ctx context.Context) {
	i := l.round
	l.round++
	cluster := []string{"east", "west"}[i%2]
	ns := fmt.Sprintf("chaos-%04d", i)
	user := fmt.Sprintf("u-%04d", i)
	l.write(ctx, "bind", cluster+"/"+ns, 0, func(ctx context.Context) error {
		_, err := l.C.Project.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{
			Project: NSProject, Cluster: cluster, Namespace: ns, Hard: map[string]string{"pods": "10"}}))
		return err
	})
	l.write(ctx, "grant", user, 0, func(ctx context.Context) error {
		_, err := l.C.RBAC.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{
			Project: RBACProject, Subject: userSubject(user), RoleTemplate: RoleTemplate}))
		return err
	})
	weight := uint32(i % 101)
	l.write(ctx, "weight", fmt.Sprint(weight), weight, func(ctx context.Context) error {
		_, err := l.C.Endpoint.SetClusterWeight(ctx, connect.NewRequest(&endpointv1.SetClusterWeightRequest{
			Namespace: WeightNamespace, Name: WeightService, Cluster: WeightCluster, Weight: weight}))
		return err
	})
	if i >= 3 && i%2 == 1 {
		j := i - 3
		oc := []string{"east", "west"}[j%2]
		ons := fmt.Sprintf("chaos-%04d", j)
		l.write(ctx, "unbind", oc+"/"+ons, 0, func(ctx context.Context) error {
			_, err := l.C.Project.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{
				Project: NSProject, Cluster: oc, Namespace: ons, Policy: projectv1.UnbindPolicy_UNBIND_POLICY_DELETE}))
			return err
		})
		ou := fmt.Sprintf("u-%04d", j)
		l.write(ctx, "revoke", ou, 0, func(ctx context.Context) error {
			_, err := l.C.RBAC.UnbindProjectRole(ctx, connect.NewRequest(&rbacv1.UnbindProjectRoleRequest{
				Project: RBACProject, Subject: userSubject(ou), RoleTemplate: RoleTemplate}))
			return err
		})
	}
}

func userSubject(name string) *rbacv1.Subject {
	return &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: name}
}

func (l *Load) write(ctx context.Context, kind, key string, weight uint32, f func(context.Context) error) {
	if ctx.Err() != nil {
		return
	}
	// A write in flight when the load stops runs to its end: cut off, its outcome would be
	// unknown although the fault did not cause it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.Timeout)
	defer cancel()
	w := Write{Kind: kind, Key: key, Start: time.Now(), WeightPayload: weight}
	err := f(wctx)
	w.End = time.Now()
	switch {
	case err == nil:
		w.Outcome = Acked
	case connect.CodeOf(err) == connect.CodeDeadlineExceeded || connect.CodeOf(err) == connect.CodeUnavailable ||
		connect.CodeOf(err) == connect.CodeUnknown || connect.CodeOf(err) == connect.CodeCanceled || connect.CodeOf(err) == connect.CodeInternal:
		// Unavailable is what our services answer when they could not learn the outcome (a
		// NATS publish without an ack): the write may have landed.
		w.Outcome = Unknown
		w.Err = err.Error()
	default:
		w.Outcome = Refused
		w.Err = err.Error()
	}
	l.Ledger.add(w)
}

// NewClusterClient returns a ClusterService client of the gateway at base that sends token.
func NewClusterClient(base, token string) clusterv1connect.ClusterServiceClient {
	return clusterv1connect.NewClusterServiceClient(&http.Client{Timeout: 30 * time.Second}, base, bearer(token))
}
