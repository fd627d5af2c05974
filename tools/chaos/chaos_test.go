//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// The whole suite runs against the compose stack that tools/scripts/chaos.sh starts (make
// chaos), in order, each scenario under the same steady load and followed by the same checks.
// Every wait is bounded; the figures go to $FLEETSTREAM_CHAOS_REPORT (docs/reliability.md).

type env struct {
	st      *Stack
	c       Clients
	cluster clusterv1connect.ClusterServiceClient
	ledger  *Ledger
	load    *Load
	rows    []row
}

type row struct {
	scenario, fault, figure string
	acked, unknown, lost    int
	views                   string
}

func TestChaos(t *testing.T) {
	e := newEnv(t)
	e.setup(t)

	ok := t.Run("kill-nats-node", e.killNATSNode) &&
		t.Run("kill-stream-leader", e.killStreamLeader) &&
		t.Run("crash-lease-holders", e.crashLeaseHolders) &&
		t.Run("partition-agent", e.partitionAgent) &&
		t.Run("restart-stack", e.restartStack) &&
		t.Run("restore-from-backup", e.restoreFromBackup)
	e.report(t)
	if !ok {
		t.Fatal("a scenario failed; the later ones did not run")
	}
}

// newEnv connects to the compose stack that the calling script started, through its API token.
func newEnv(t *testing.T) *env {
	root := os.Getenv("FLEETSTREAM_ROOT")
	if root == "" {
		root = "../.."
	}
	root, _ = filepath.Abs(root)
	st := DefaultStack(root)
	if v := os.Getenv("FLEETSTREAM_COMPOSE"); v != "" {
		st.Compose = strings.Fields(v)
	}
	tokens, err := st.Secret("api-tokens")
	if err != nil {
		t.Fatalf("the compose stack's API token (start it with make chaos): %v", err)
	}
	token := strings.SplitN(tokens, ",", 2)[0]
	e := &env{st: st, c: NewClients(st.Gateway, token), ledger: &Ledger{}}
	e.cluster = NewClusterClient(st.Gateway, token)
	e.load = &Load{C: e.c, Ledger: e.ledger, Every: 500 * time.Millisecond, Timeout: 3 * time.Second}
	return e
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ignoreExists(err error) error {
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		return nil
	}
	return err
}

// setup creates the load's projects, role template and the RBAC project's namespace on both
// clusters.
func (e *env) setup(t *testing.T) {
	ctx := ctxFor(t, 2*time.Minute)
	for _, p := range []string{NSProject, RBACProject} {
		_, err := e.c.Project.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: p}))
		if err := ignoreExists(err); err != nil {
			t.Fatalf("create project %s: %v", p, err)
		}
	}
	_, err := e.c.RBAC.CreateRoleTemplate(ctx, connect.NewRequest(&rbacv1.CreateRoleTemplateRequest{Template: &rbacv1.RoleTemplate{
		Name:  RoleTemplate,
		Rules: []*rbacv1.PolicyRule{{Verbs: []string{"get", "list", "create", "delete"}, ApiGroups: []string{"apps"}, Resources: []string{"deployments"}}},
	}}))
	if err := ignoreExists(err); err != nil {
		t.Fatalf("create role template: %v", err)
	}
	for _, cl := range []string{"east", "west"} {
		_, err := e.c.Project.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: RBACProject, Cluster: cl, Namespace: RBACNamespace}))
		if err := ignoreExists(err); err != nil {
			t.Fatalf("bind %s on %s: %v", RBACNamespace, cl, err)
		}
	}
	e.eventually(t, 2*time.Minute, "the RBAC project's namespace is Available on both clusters", func(ctx context.Context) error {
		bs, err := e.c.Project.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: RBACProject}))
		if err != nil {
			return err
		}
		n := 0
		for _, b := range bs.Msg.GetBindings() {
			if b.GetPhase() == projectv1.BindingPhase_BINDING_PHASE_AVAILABLE {
				n++
			}
		}
		if n != 2 {
			return fmt.Errorf("%d of 2 Available", n)
		}
		return nil
	})
}

// eventually retries f every second until it succeeds or d passes, and fails the test then.
func (e *env) eventually(t *testing.T, d time.Duration, what string, f func(context.Context) error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < d {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = f(ctx)
		cancel()
		if err == nil {
			return time.Since(start)
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("%s: not after %s: %v", what, d, err)
	return 0
}

// withLoad runs the load while f runs, then stops it (the write in flight completes).
func (e *env) withLoad(f func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.load.Run(ctx) }()
	defer func() { cancel(); <-done }() // also when f fails the test
	f()
}

// settle waits until what the ledger says must hold is served, then checks every view against
// a rebuild from its stream. It returns the acknowledged writes still missing at the deadline
// (the test has failed then) and a summary of the views.
func (e *env) settle(t *testing.T) (lost int, views string) {
	t.Helper()
	ex := e.ledger.Expect()
	var diffs []string
	start := time.Now()
	for time.Since(start) < 2*time.Minute {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		weights, err := e.st.Weights(ctx)
		if err == nil {
			diffs, err = CheckWrites(ctx, e.c, ex, weights)
		}
		cancel()
		if err == nil && len(diffs) == 0 {
			break
		}
		if err != nil {
			diffs = []string{err.Error()}
		}
		time.Sleep(time.Second)
	}
	for _, d := range diffs {
		if strings.Contains(d, "acknowledged, missing") || strings.Contains(d, "acknowledged true, served false") {
			lost++
		}
	}
	if len(diffs) > 0 {
		t.Errorf("after 2 minutes, %d differences from the acknowledged writes, e.g.:\n  %s", len(diffs), strings.Join(first(diffs, 20), "\n  "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	vs, vdiffs, err := e.st.VerifyViews(ctx)
	if err != nil {
		t.Errorf("verify views: %v", err)
		return lost, "not verified"
	}
	entries := 0
	for _, v := range vs {
		entries += v.Entries
	}
	if len(vdiffs) > 0 {
		t.Errorf("%d view entries differ from a rebuild from the streams, e.g.:\n  %s", len(vdiffs), strings.Join(first(vdiffs, 20), "\n  "))
		return lost, fmt.Sprintf("%d mismatches", len(vdiffs))
	}
	return lost, fmt.Sprintf("%d views (%d entries) = rebuild", len(vs), entries)
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (e *env) addRow(t *testing.T, scenario, fault, figure string, before [3]int) {
	lost, views := e.settle(t)
	a, _, u := e.ledger.Counts()
	e.rows = append(e.rows, row{scenario: scenario, fault: fault, figure: figure, acked: a - before[0], unknown: u - before[2], lost: lost, views: views})
	t.Logf("%s: %s; %s; acked writes %d, unknown %d, lost %d; %s", scenario, fault, figure, a-before[0], u-before[2], lost, views)
}

func (e *env) counts() [3]int {
	a, r, u := e.ledger.Counts()
	return [3]int{a, r, u}
}

// resumed returns how long after the fault took effect at t0 API writes resumed (the first
// acknowledgement of a write sent after t0) and describes it; writes that never resume while
// the fault lasts fail the test (a three-node cluster must serve on two, and a service on its
// other replica).
func (e *env) resumed(t *testing.T, t0 time.Time) (time.Duration, string, bool) {
	d, failed, skipped, ok := e.ledger.Resume(t0)
	if !ok {
		t.Errorf("no write sent after the fault succeeded while it lasted")
		return 0, "writes never resumed", false
	}
	return d, fmt.Sprintf("writes resumed after %s (%d failed first, %d skipped with every slot busy)", d.Round(10*time.Millisecond), failed, skipped), true
}

// The per-kind goal is reported, not asserted: how long an election takes depends on the
// machine's load (11.3 s once at load 5, when a first vote failed), and a CI run must not fail
// on a slow one. What fails the suite is a kind of write (bind, grant or weight) not
// acknowledged again at all while the node is down although its goal ended within the outage,
// as weights were not in a CI run before the caches read with consumer.Ordered
// (docs/reliability.md), or acknowledged writes lost.
//
// Issue 14 asks API writes to resume within 5 s of a NATS node's death. They cannot while a
// stream or bucket on the write path has no leader, nor while the JetStream meta group has none
// (no consumer can be created then, a restarted watch's included): a crashed leader's Raft
// group works again only once a follower's election timer fires, 4-9 s at random in
// nats-server (minElectionTimeout/maxElectionTimeout in raft.go, not configurable), whoever
// writes. So the goal is: within 5 s, or within electionSlack of the last new leader of what
// the dead node led, whichever is later; for a KV bucket, of when it first took a bare nats.go
// writer's write (WatchWritable) if that is later than /jsz showed its leader. What is ours after the elections: a round of the load (every 500
// ms), the write itself, and a view whose pull was on the dead node (moved within 2 s of the
// death, during the election: consumer.Heartbeat).
const electionSlack = 3 * time.Second

// outage is how long killAndReturn keeps a NATS node down (it watches the elections that long).
const outage = 15 * time.Second

func electionGoal(led []string, elected, writable map[string]time.Duration) time.Duration {
	goal := 5 * time.Second
	for _, name := range led {
		d, ok := elected[name]
		if !ok {
			d = outage // not elected while watched: the whole fault
		}
		// A bucket that took a bare writer's write only later than /jsz showed its leader:
		// no write to it could be acknowledged before.
		if w, ok := writable[name]; ok {
			d = max(d, w)
		}
		goal = max(goal, d+electionSlack)
	}
	return goal
}

// describeWritable says when the buckets the node led took a bare nats.go writer's write again.
func describeWritable(led []string, writable map[string]time.Duration) string {
	var parts, never []string
	for _, name := range led {
		if !strings.HasPrefix(name, "KV_") {
			continue
		}
		if d, ok := writable[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %s", name, d.Round(10*time.Millisecond)))
		} else {
			never = append(never, name)
		}
	}
	if len(parts) == 0 && len(never) == 0 {
		return "it led no KV bucket"
	}
	out := "a bare nats.go writer's first write taken after the kill: " + strings.Join(parts, ", ")
	if len(never) > 0 {
		out += fmt.Sprintf(" (none within 15 s: %s)", strings.Join(never, ", "))
	}
	return out
}

func (e *env) killAndReturn(t *testing.T, node string) string {
	ctx := ctxFor(t, 5*time.Minute)
	var desc string
	e.withLoad(func() {
		time.Sleep(5 * time.Second)
		// What the node leads before it dies: the streams and buckets whose new leaders the
		// writes must wait for (nats-server's floor, timed below in the same run).
		before, err := e.st.StreamLeaders(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var led []string
		for name, s := range before {
			if s.Leader == node {
				led = append(led, name)
			}
		}
		sort.Strings(led)
		// Bare nats.go writers, one per hub service identity, probe the buckets the node led.
		var probes []*nats.Conn
		for _, sv := range AllViews() {
			nc, _, err := e.st.Connect(sv)
			if err != nil {
				t.Logf("no write probe as %s: %v", sv.Service, err)
				continue
			}
			defer nc.Close()
			probes = append(probes, nc)
		}
		// Timed from the node's death: a write sent before it may have been accepted by then.
		t0, err := e.st.Kill(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		writableC := make(chan map[string]time.Duration, 1)
		go func() { writableC <- e.st.WatchWritable(ctx, probes, led, t0, outage) }()
		elected := e.st.WatchElections(ctx, node, led, t0, outage)
		writable := <-writableC
		_, what, ok := e.resumed(t, t0)
		// Every kind of write must come back, not only the first: binds, grants and weights
		// go to different streams and buckets, which the dead node may or may not have led.
		byKind := e.ledger.ResumeByKind(t0)
		goal := electionGoal(led, elected, writable)
		var all time.Duration
		var kinds []string
		met := ok
		for _, k := range []string{"bind", "grant", "weight"} {
			// Every weight write sets the same key, and the load never has two writes of one
			// key in flight: one sent just before the election can hold the next for up to
			// the load's timeout.
			g := goal
			if k == "weight" {
				g += e.load.Timeout
			}
			d, resumed := byKind[k]
			if !resumed {
				kinds = append(kinds, k+" never")
				met = false
				if g < outage {
					t.Errorf("no %s sent after %s died was acknowledged in the %s it was down, though its goal was %s",
						k, node, outage, g.Round(10*time.Millisecond))
				} else {
					t.Logf("no %s sent after %s died was acknowledged while it was down (goal %s, past the outage)", k, node, g.Round(10*time.Millisecond))
				}
				continue
			}
			all = max(all, d)
			kinds = append(kinds, fmt.Sprintf("%s %s", k, d.Round(10*time.Millisecond)))
			if d > g {
				t.Logf("%s writes resumed %s after %s died, later than %s (5 s, or %s after the last new leader of what it led)",
					k, d.Round(time.Millisecond), node, g.Round(time.Millisecond), electionSlack)
				met = false
			}
		}
		desc = fmt.Sprintf("%s; every kind after %s (%s); %s; %s", what, all.Round(10*time.Millisecond), strings.Join(kinds, ", "),
			describeElections(node, led, elected), describeWritable(led, writable))
		if met {
			desc += fmt.Sprintf("; goal (≤ %s) met", goal.Round(10*time.Millisecond))
		} else {
			desc += "; goal MISSED"
		}
		if err := e.st.Start(ctx, node); err != nil {
			t.Fatal(err)
		}
		catchUp := e.eventually(t, 2*time.Minute, node+" healthy (current with every stream) again", func(ctx context.Context) error {
			if !e.st.NATSHealthy(ctx, node) {
				return errors.New("not healthy")
			}
			return nil
		})
		desc += fmt.Sprintf("; %s caught up %s after its restart", node, catchUp.Round(100*time.Millisecond))
		time.Sleep(5 * time.Second)
	})
	return desc
}

// describeElections says how long after the kill each stream or bucket the node led had a
// new leader: a write to one of them cannot succeed before, whoever sends it.
func describeElections(node string, led []string, elected map[string]time.Duration) string {
	if len(led) == 0 {
		return node + " led no stream, bucket or the meta group"
	}
	first, last := time.Duration(-1), time.Duration(0)
	var late []string
	lastName := ""
	for _, name := range led {
		d, ok := elected[name]
		if !ok {
			late = append(late, name)
			continue
		}
		if first < 0 || d < first {
			first = d
		}
		if d >= last {
			last, lastName = d, name
		}
	}
	if len(late) == len(led) {
		return fmt.Sprintf("%s led %d Raft groups (%s); none had a new leader within 15 s", node, len(led), strings.Join(led, ", "))
	}
	out := fmt.Sprintf("%s led %d Raft groups (%s); nats-server elected their new leaders %s-%s after the kill (the last: %s)",
		node, len(led), strings.Join(led, ", "), first.Round(10*time.Millisecond), last.Round(10*time.Millisecond), lastName)
	if len(late) > 0 {
		out += fmt.Sprintf(" (%s: none within 15 s)", strings.Join(late, ", "))
	}
	return out
}

func (e *env) killNATSNode(t *testing.T) {
	before := e.counts()
	desc := e.killAndReturn(t, "nats-3")
	e.addRow(t, "kill one NATS node", "docker kill nats-3 for 15 s under load, then start it", desc, before)
}

func (e *env) killStreamLeader(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	before := e.counts()
	s0, err := e.st.StreamLeaders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var s1 map[string]StreamState
	e.withLoad(func() { time.Sleep(5 * time.Second) })
	if s1, err = e.st.StreamLeaders(ctx); err != nil {
		t.Fatal(err)
	}
	busiest, most := "", uint64(0)
	for name, s := range s1 {
		// The two reads may come from different nodes, one of them behind the other: a last
		// sequence that seems to go back is no movement, not a uint64 wrapped around.
		prev := s0[name].LastSeq
		if s.LastSeq <= prev || strings.HasPrefix(name, "KV_") {
			continue
		}
		if d := s.LastSeq - prev; d > most {
			busiest, most = name, d
		}
	}
	if busiest == "" {
		t.Fatalf("no stream moved in 5 s of load (by /jsz)")
	}
	leader := s1[busiest].Leader
	if leader == "" {
		t.Fatalf("stream %s has no leader in /jsz", busiest)
	}
	desc := e.killAndReturn(t, leader)
	e.addRow(t, "kill the busiest stream's leader", fmt.Sprintf("docker kill %s, leader of %s (%d events in 5 s)", leader, busiest, most), desc, before)
}

// watchLease sends every value the lease key takes (a deleted or expired key as "") until stop.
func (e *env) watchLease(ctx context.Context, sv ServiceViews, name string) (<-chan string, func(), error) {
	nc, js, err := e.st.Connect(sv)
	if err != nil {
		return nil, nil, err
	}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	w, err := kv.Watch(ctx, name, jetstream.UpdatesOnly())
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	out := make(chan string, 64)
	go func() {
		// Ends with stop (the watch's channel closes) or ctx, whichever comes first.
		for {
			select {
			case <-ctx.Done():
				return
			case en, ok := <-w.Updates():
				if !ok {
					return
				}
				if en == nil {
					continue
				}
				v := ""
				if en.Operation() == jetstream.KeyValuePut {
					v = string(en.Value())
				}
				select {
				case out <- v:
				default:
				}
			}
		}
	}()
	return out, func() { _ = w.Stop(); nc.Close() }, nil
}

// leaseHolder reads a lease's holder (host/pid-suffix) as the service that holds it.
func (e *env) leaseHolder(ctx context.Context, sv ServiceViews, name string) (string, error) {
	nc, js, err := e.st.Connect(sv)
	if err != nil {
		return "", err
	}
	defer nc.Close()
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		return "", err
	}
	en, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return string(en.Value()), nil
}

// leaseTakeoverWorst is how long after its holder dies a lease can take to move, by pkg/lease's
// protocol: the holder's last renewal was sent at most at the crash; a contender counts a whole
// TTL from when it first read that renewal's revision, which is at once when its watch wakes it
// but up to one poll interval (TTL/3) later when the wake-up is missed; a key that expired (the
// bucket's MaxAge is the TTL) is seen at the same poll. So TTL + TTL/3 (6.67 s for 5 s).
const leaseTakeoverWorst = lease.DefaultTTL + lease.DefaultTTL/3

// leaseRoundTrips covers the round trips the worst case leaves out: the contender's Get and
// Update and the watch delivering the new value to the check, on a shared 2-core machine.
const leaseRoundTrips = time.Second

func (e *env) crashLeaseHolders(t *testing.T) {
	views := AllViews()
	for _, c := range []struct {
		sv    ServiceViews
		lease string
	}{
		{views[2], rbacsync.FanoutLease},
		{views[1], "view." + namespacebinding.Projections()[1].Name},
	} {
		before := e.counts()
		ctx := ctxFor(t, 5*time.Minute)
		var desc string
		e.withLoad(func() {
			time.Sleep(3 * time.Second)
			holder, err := e.leaseHolder(ctx, c.sv, c.lease)
			if err != nil || holder == "" {
				t.Fatalf("lease %s: holder %q: %v", c.lease, holder, err)
			}
			hosts, err := e.st.Hostnames(ctx)
			if err != nil {
				t.Fatal(err)
			}
			host, _, _ := strings.Cut(holder, "/")
			ctr, ok := hosts[host]
			if !ok {
				t.Fatalf("lease %s is held by %s: no container has host name %s", c.lease, holder, host)
			}
			// Watch the lease key from before the crash, so the takeover is timed when the
			// new holder's write arrives, not when a poll happens to see it.
			changes, stopWatch, err := e.watchLease(ctx, c.sv, c.lease)
			if err != nil {
				t.Fatal(err)
			}
			defer stopWatch()
			t0, err := e.st.Crash(ctx, ctr[0])
			if err != nil {
				t.Fatal(err)
			}
			var next string
			var took time.Duration
			deadline := time.After(30 * time.Second)
			for next == "" {
				select {
				case h := <-changes:
					if h != "" && h != holder {
						next, took = h, time.Since(t0)
					}
				case <-deadline:
					t.Fatalf("lease %s: no other holder 30 s after the crash", c.lease)
				}
			}
			if took > leaseTakeoverWorst+leaseRoundTrips {
				t.Errorf("lease %s taken over after %s, want within %s (TTL + TTL/3, pkg/lease's worst case) + %s",
					c.lease, took, leaseTakeoverWorst, leaseRoundTrips)
			}
			nh, _, _ := strings.Cut(next, "/")
			desc = fmt.Sprintf("lease taken over after %s by %s", took.Round(100*time.Millisecond), hosts[nh][1])
			if hosts[nh][1] == "" {
				desc = fmt.Sprintf("lease taken over after %s by the restarted %s", took.Round(100*time.Millisecond), ctr[1])
			}
			desc += fmt.Sprintf(" (worst case %s)", leaseTakeoverWorst.Round(10*time.Millisecond))
			time.Sleep(5 * time.Second)
			_, what, _ := e.resumed(t, t0)
			desc += "; " + what
			// Let the crashed replica come back before the next fault.
			e.eventually(t, 2*time.Minute, ctr[1]+" running again", func(ctx context.Context) error {
				out, err := e.st.ComposeRun(ctx, "ps", "--services", "--filter", "status=running")
				if err != nil {
					return err
				}
				for _, s := range strings.Fields(out) {
					if s == ctr[1] {
						return nil
					}
				}
				return errors.New("not running")
			})
			desc = fmt.Sprintf("SIGKILL %s (holder of %s); %s", ctr[1], c.lease, desc)
		})
		e.addRow(t, "crash a lease holder", "kill -9 of the replica holding "+c.lease, desc, before)
	}
}

func (e *env) unreachable(ctx context.Context, cluster string) (bool, error) {
	r, err := e.cluster.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: cluster}))
	if err != nil {
		return false, err
	}
	for _, tn := range r.Msg.GetCluster().GetTaints() {
		if tn.GetKey() == "fleetstream.io/unreachable" {
			return true, nil
		}
	}
	return false, nil
}

func (e *env) partitionAgent(t *testing.T) {
	const agent, cluster = "west-agent", "west"
	before := e.counts()
	ctx := ctxFor(t, 10*time.Minute)
	var tainted time.Duration
	var rec time.Time
	e.withLoad(func() {
		time.Sleep(3 * time.Second)
		id, nets, err := e.st.Disconnect(ctx, agent)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		tainted = e.eventually(t, 60*time.Second, cluster+" tainted unreachable", func(ctx context.Context) error {
			u, err := e.unreachable(ctx, cluster)
			if err == nil && !u {
				err = errors.New("not tainted")
			}
			return err
		})
		time.Sleep(time.Until(t0.Add(60 * time.Second)))
		if err := e.st.Reconnect(ctx, id, nets, agent); err != nil {
			t.Fatal(err)
		}
		rec = time.Now()
	})
	ms, err := e.st.Members("east", "west")
	if err != nil {
		t.Fatal(err)
	}
	ex := e.ledger.Expect()
	var stale int
	e.eventually(t, 3*time.Minute, "both clusters' authorizers agree with the acknowledged grants", func(ctx context.Context) error {
		stale = 0
		var all []string
		for _, m := range ms {
			diffs, s, err := CheckAccess(ctx, m, ex)
			if err != nil {
				return err
			}
			stale += s
			all = append(all, diffs...)
		}
		if len(all) > 0 {
			return fmt.Errorf("%d differences, e.g. %s", len(all), strings.Join(first(all, 5), "; "))
		}
		return nil
	})
	converged := time.Since(rec)
	// The taint goes with the first heartbeat cluster-import hears after the reconnect: the
	// agent's next one (every 10 s; those of the partition were not published) may come after
	// the RoleBindings converged, so it is waited for, not checked at once.
	e.eventually(t, 20*time.Second, cluster+" no longer tainted unreachable", func(ctx context.Context) error {
		if u, err := e.unreachable(ctx, cluster); err != nil || u {
			return fmt.Errorf("%s still tainted unreachable (%v)", cluster, err)
		}
		return nil
	})
	untainted := time.Since(rec)
	fig := fmt.Sprintf("tainted unreachable %s into the partition; converged %s after reconnecting with %d stale RoleBindings (SubjectAccessReview of %d users on each cluster); the taint gone %s after reconnecting",
		tainted.Round(time.Second), converged.Round(100*time.Millisecond), stale, len(ex.Granted), untainted.Round(100*time.Millisecond))
	e.addRow(t, "partition a member's agent", "docker network disconnect west-agent for 60 s while grants and binds change", fig, before)
}

// listing is what the API serves of the load's objects, compared before and after a restart.
func (e *env) listing(ctx context.Context) (string, error) {
	var b strings.Builder
	ps, err := e.c.Project.ListProjects(ctx, connect.NewRequest(&projectv1.ListProjectsRequest{}))
	if err != nil {
		return "", err
	}
	for _, p := range ps.Msg.GetProjects() {
		fmt.Fprintf(&b, "project %s\n", p.GetName())
	}
	for _, p := range []string{NSProject, RBACProject} {
		bs, err := e.c.Project.ListNamespaceBindings(ctx, connect.NewRequest(&projectv1.ListNamespaceBindingsRequest{Project: p}))
		if err != nil {
			return "", err
		}
		for _, x := range bs.Msg.GetBindings() {
			fmt.Fprintf(&b, "binding %s %s/%s %s\n", p, x.GetCluster(), x.GetNamespace(), x.GetId())
		}
	}
	rbs, err := e.c.RBAC.ListProjectRoleBindings(ctx, connect.NewRequest(&rbacv1.ListProjectRoleBindingsRequest{Project: RBACProject}))
	if err != nil {
		return "", err
	}
	for _, x := range rbs.Msg.GetBindings() {
		fmt.Fprintf(&b, "grant %s %s\n", x.GetSubject().GetName(), x.GetRoleTemplate())
	}
	cs, err := e.cluster.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	if err != nil {
		return "", err
	}
	for _, c := range cs.Msg.GetClusters() {
		fmt.Fprintf(&b, "cluster %s %v\n", c.GetName(), c.GetLabels())
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n"), nil
}

func (e *env) restartStack(t *testing.T) {
	before := e.counts()
	e.withLoad(func() { time.Sleep(5 * time.Second) })
	e.settle(t)
	ctx := ctxFor(t, 10*time.Minute)
	was, err := e.listing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := e.st.ComposeRun(ctx, "stop"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(t0)
	t1 := time.Now()
	if _, err := e.st.ComposeRun(ctx, "start"); err != nil {
		t.Fatal(err)
	}
	e.eventually(t, 3*time.Minute, "every NATS node healthy and the gateway ready", func(ctx context.Context) error {
		for n := range e.st.Monitor {
			if !e.st.NATSHealthy(ctx, n) {
				return fmt.Errorf("%s not healthy", n)
			}
		}
		return e.st.GatewayReady(ctx)
	})
	ready := time.Since(t1)
	var now string
	e.eventually(t, 2*time.Minute, "the API serves what it served before the restart", func(ctx context.Context) error {
		if now, err = e.listing(ctx); err != nil {
			return err
		}
		if now != was {
			return fmt.Errorf("listing differs (%d lines before, %d after)", strings.Count(was, "\n")+1, strings.Count(now, "\n")+1)
		}
		return nil
	})
	served := time.Since(t1)
	after := e.counts()
	e.withLoad(func() { time.Sleep(5 * time.Second) })
	fig := fmt.Sprintf("stop took %s; after start, ready in %s and the same listing (%d objects) served in %s; then %d writes acknowledged in 5 s of load",
		stopped.Round(time.Second), ready.Round(time.Second), strings.Count(was, "\n")+1, served.Round(time.Second), e.counts()[0]-after[0])
	e.addRow(t, "restart the whole stack", "docker-compose stop, then start, with the volumes", fig, before)
}

func (e *env) report(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "| scenario | fault | figures | acked writes | unknown outcome | acked writes lost | views |\n|---|---|---|---|---|---|---|\n")
	for _, r := range e.rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %s |\n", r.scenario, r.fault, r.figure, r.acked, r.unknown, r.lost, r.views)
	}
	t.Log("\n" + b.String())
	if p := os.Getenv("FLEETSTREAM_CHAOS_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Errorf("write report: %v", err)
		}
	}
}
