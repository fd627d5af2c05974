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

// Ledger records every write of the load in the order they ended. The load never has two
// writes of one key in flight at once (see Load), so per key that is also the order they were
// sent, which is all Expect needs.
type Ledger struct {
	mu      sync.Mutex
	writes  []Write
	skipped []time.Time // when the load skipped a write (every slot busy, or its key in flight)
}

func (l *Ledger) skip(at time.Time) {
	l.mu.Lock()
	l.skipped = append(l.skipped, at)
	l.mu.Unlock()
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
		key := ledgerKey(w.Kind, w.Key)
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

// ledgerKey is the object a write changes: binds and unbinds of one namespace share it, grants
// and revokes of one user, and every weight write (they all set the same weight).
func ledgerKey(kind, key string) string {
	switch kind {
	case "bind", "unbind":
		return "n" + key
	case "grant", "revoke":
		return "g" + key
	case "weight":
		return "w"
	}
	return kind + key
}

// Resume is how long after t the earliest acknowledgement of a write sent at or after t came
// (writes in flight at t do not count: the API may have accepted them before the fault), how
// many writes sent after t failed before it and how many the load skipped meanwhile (every
// slot busy). ok is false if no write sent after t was acknowledged.
func (l *Ledger) Resume(t time.Time) (d time.Duration, failed, skipped int, ok bool) {
	ws := l.Writes()
	var first time.Time
	for _, w := range ws {
		if w.Outcome == Acked && !w.Start.Before(t) && (first.IsZero() || w.End.Before(first)) {
			first = w.End
		}
	}
	if first.IsZero() {
		return 0, 0, 0, false
	}
	for _, w := range ws {
		if w.Outcome != Acked && !w.Start.Before(t) && !w.End.After(first) {
			failed++
		}
	}
	l.mu.Lock()
	for _, at := range l.skipped {
		if !at.Before(t) && !at.After(first) {
			skipped++
		}
	}
	l.mu.Unlock()
	return first.Sub(t), failed, skipped, true
}

// ResumeByKind is, per kind of write, how long after t the earliest acknowledgement of a write
// of that kind sent at or after t came; a kind with none is missing. Writes of one kind go to
// their own streams and buckets, so a fault that stops one kind (its stream lost its leader)
// may leave the others going: Resume is the first kind back, this says when each was.
func (l *Ledger) ResumeByKind(t time.Time) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, w := range l.Writes() {
		if w.Outcome != Acked || w.Start.Before(t) {
			continue
		}
		if d, ok := out[w.Kind]; !ok || w.End.Sub(t) < d {
			out[w.Kind] = w.End.Sub(t)
		}
	}
	return out
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

// MaxInFlight is how many writes the load has in flight at most: a round's writes go out
// together, and a write stuck in a fault (up to its timeout) holds one slot while the next
// rounds go on, so the time writes take to resume after a fault is the API's, not the time the
// load spent waiting behind a stuck write. At 3 to 5 writes per 500 ms round and a 3 s timeout,
// 16 slots keep the load going through most of a stall; a write finding every slot busy is
// skipped (and counted), not queued.
const MaxInFlight = 16

// Load sends a steady stream of writes until its context ends: one round per Every, each
// write on its own from a pool of MaxInFlight slots. Two writes of one object (ledgerKey) are
// never in flight at once, so the ledger's order per object is the order they were sent; a
// write whose object is still in flight is skipped.
type Load struct {
	C       Clients
	Ledger  *Ledger
	Every   time.Duration // one round (bind, grant, weight and every other round an unbind and a revoke) per Every
	Timeout time.Duration // per write
	round   int

	wg       sync.WaitGroup
	slots    chan struct{}
	mu       sync.Mutex
	inFlight map[string]bool
}

// Run sends rounds until ctx ends and returns when the writes in flight have ended (each within
// its Timeout). Rounds continue numbering across calls, so every call writes new keys. Run
// must not be called again before it returned.
func (l *Load) Run(ctx context.Context) {
	if l.slots == nil {
		l.slots = make(chan struct{}, MaxInFlight)
		l.inFlight = map[string]bool{}
	}
	defer l.wg.Wait()
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

// write sends one write in its own goroutine, if a slot is free and no write of its object is
// in flight; otherwise it records the skip.
func (l *Load) write(ctx context.Context, kind, key string, weight uint32, f func(context.Context) error) {
	if ctx.Err() != nil {
		return
	}
	obj := ledgerKey(kind, key)
	l.mu.Lock()
	busy := l.inFlight[obj]
	if !busy {
		select {
		case l.slots <- struct{}{}:
			l.inFlight[obj] = true
		default:
			busy = true
		}
	}
	l.mu.Unlock()
	if busy {
		l.Ledger.skip(time.Now())
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.send(ctx, kind, key, weight, f)
		l.mu.Lock()
		delete(l.inFlight, obj)
		<-l.slots
		l.mu.Unlock()
	}()
}

func (l *Load) send(ctx context.Context, kind, key string, weight uint32, f func(context.Context) error) {
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

// AtBackup is what a backup taken from start to end holds of the load's objects, by the record:
// per object, every state it may have in the backup. An object whose writes all ended before
// the backup started (acknowledged: in it; refused: not) has one state; a write in flight while
// the backup ran, or one with an unknown outcome, adds its state as possible; a write sent after
// the backup ended is not in it.
type AtBackup struct {
	// Bound maps cluster/namespace to its possible states (bound true, unbound or never bound
	// false).
	Bound map[string]map[bool]bool
	// Granted maps a user to its possible states.
	Granted map[string]map[bool]bool
	// Weights are the weight's possible values (100, the default, when never set).
	Weights map[uint32]bool
}

// Uncertain counts the objects with more than one possible state: those in flight while the
// backup ran.
func (a AtBackup) Uncertain() int {
	n := 0
	for _, m := range []map[string]map[bool]bool{a.Bound, a.Granted} {
		for _, s := range m {
			if len(s) > 1 {
				n++
			}
		}
	}
	if len(a.Weights) > 1 {
		n++
	}
	return n
}

// ExpectAtBackup derives from the record what a backup taken from start to end holds.
func (l *Ledger) ExpectAtBackup(start, end time.Time) AtBackup {
	at := AtBackup{Bound: map[string]map[bool]bool{}, Granted: map[string]map[bool]bool{}, Weights: map[uint32]bool{100: true}}
	ws := l.Writes()
	// Per object the record's order is the order the writes were sent (Ledger); sorting by
	// start keeps it and puts every object's writes in the order they took effect.
	sort.SliceStable(ws, func(i, j int) bool { return ws[i].Start.Before(ws[j].Start) })
	for _, w := range ws {
		if !w.Start.Before(end) || w.Outcome == Refused {
			continue // sent after the backup ended, or did not happen
		}
		var states map[bool]bool
		var state bool
		switch w.Kind {
		case "bind", "unbind":
			if at.Bound[w.Key] == nil {
				at.Bound[w.Key] = map[bool]bool{false: true}
			}
			states, state = at.Bound[w.Key], w.Kind == "bind"
		case "grant", "revoke":
			if at.Granted[w.Key] == nil {
				at.Granted[w.Key] = map[bool]bool{false: true}
			}
			states, state = at.Granted[w.Key], w.Kind == "grant"
		case "weight":
			if w.Outcome == Acked && w.End.Before(start) {
				at.Weights = map[uint32]bool{w.WeightPayload: true}
			} else {
				at.Weights[w.WeightPayload] = true
			}
			continue
		default:
			continue
		}
		if w.Outcome == Acked && w.End.Before(start) {
			clear(states)
		}
		states[state] = true
	}
	return at
}

// CheckAtBackup compares what the API serves of the load's objects with what the backup holds by
// the record, and returns one line per difference: an object in a state the backup cannot hold,
// or served although the load never wrote it before the backup ended.
func CheckAtBackup(ctx context.Context, c Clients, at AtBackup, weights map[uint32]bool) ([]string, error) {
	var diffs []string
	bs, err := loadBindings(ctx, c)
	if err != nil {
		return nil, err
	}
	served := map[string]bool{}
	for _, b := range bs {
		// Terminating is an unbind recorded (the compose members run no namespace controller).
		served[b.GetCluster()+"/"+b.GetNamespace()] = b.GetPhase() != projectv1.BindingPhase_BINDING_PHASE_TERMINATING
	}
	diffs = append(diffs, compareStates("binding", at.Bound, served)...)
	rbs, err := loadGrants(ctx, c)
	if err != nil {
		return nil, err
	}
	granted := map[string]bool{}
	for _, b := range rbs {
		granted[b.GetSubject().GetName()] = true
	}
	diffs = append(diffs, compareStates("grant", at.Granted, granted)...)
	for w := range weights {
		if !at.Weights[w] {
			diffs = append(diffs, fmt.Sprintf("weight of %s/%s on %s: served %d, the backup holds one of %v", WeightNamespace, WeightService, WeightCluster, w, keysOf(at.Weights)))
		}
	}
	sort.Strings(diffs)
	return diffs, nil
}

func compareStates(what string, want map[string]map[bool]bool, served map[string]bool) []string {
	var diffs []string
	for key, states := range want {
		if got := served[key]; !states[got] {
			diffs = append(diffs, fmt.Sprintf("%s %s: served %v, the backup holds %v", what, key, got, !got))
		}
	}
	for key, got := range served {
		if _, known := want[key]; !known && got {
			diffs = append(diffs, fmt.Sprintf("%s %s: served, but not written before the backup ended", what, key))
		}
	}
	return diffs
}

// LongestGap is the longest time between from and to in which no write was acknowledged (the
// ends of the interval count as acknowledgements), and when it began.
func (l *Ledger) LongestGap(from, to time.Time) (time.Duration, time.Time) {
	var ends []time.Time
	for _, w := range l.Writes() {
		if w.Outcome == Acked && w.End.After(from) && w.End.Before(to) {
			ends = append(ends, w.End)
		}
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	ends = append(append([]time.Time{from}, ends...), to)
	var gap time.Duration
	at := from
	for i := 1; i < len(ends); i++ {
		if d := ends[i].Sub(ends[i-1]); d > gap {
			gap, at = d, ends[i-1]
		}
	}
	return gap, at
}

// Refusals counts the refused writes that ended between from and to by their error.
func (l *Ledger) Refusals(from, to time.Time) map[string]int {
	out := map[string]int{}
	for _, w := range l.Writes() {
		if w.Outcome == Refused && w.End.After(from) && w.End.Before(to) {
			out[w.Kind+": "+w.Err]++
		}
	}
	return out
}
