//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// The order of a rolling upgrade (docs/operations.md, Upgrades): cluster-import first, because it
// answers NATS's auth callout and so hands every other service and agent its permissions (N's
// services get N's); then every other hub service, each replica in turn while the other serves;
// the gateway; then the agents, hub-hosted and in the members' clusters, last.
var (
	upgradeHub    = []string{"cluster-import", "cluster-import-2", "namespace-binding", "namespace-binding-2", "rbac-sync", "rbac-sync-2", "endpoint-collector", "endpoint-collector-2", "gateway"}
	upgradeAgents = []string{"hosted-agent", "east-agent", "west-agent"}
	// Services whose readiness Stack.Ready can see (an API port); the others are waited for
	// otherwise.
	upgradeNoAPI = map[string]bool{"hosted-agent": true, "east-agent": true, "west-agent": true}
)

// TestRollingUpgrade runs against the stack tools/scripts/upgrade.sh starts on N−1's images
// (fleetstream/<name>:previous, deploy/upgrade/previous-release): under the steady load, it
// replaces every hub service's replicas one at a time by N's images (:latest), then, with the hub
// on N and the agents still on N−1, checks that a grant made then reaches both members'
// RoleBindings, then replaces the agents. Zero acknowledged writes lost and every view equal to
// its rebuild, at the skew and at the end.
func TestRollingUpgrade(t *testing.T) {
	prev, cur := os.Getenv("FLEETSTREAM_PREVIOUS_VERSION"), os.Getenv("FLEETSTREAM_CURRENT_VERSION")
	if prev == "" || cur == "" || prev == cur {
		t.Fatalf("FLEETSTREAM_PREVIOUS_VERSION %q and FLEETSTREAM_CURRENT_VERSION %q: want two versions (run it with make upgrade-check)", prev, cur)
	}
	e := newEnv(t)
	ctx := ctxFor(t, 25*time.Minute)

	// The stack runs N−1, and N's images differ from it: otherwise this proves nothing.
	for _, sv := range append(append([]string{}, upgradeHub...), upgradeAgents...) {
		ref, id, err := e.st.ImageOf(ctx, sv)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(ref, ":previous") {
			t.Fatalf("%s runs %s, want N−1's :previous image", sv, ref)
		}
		repo := strings.TrimSuffix(ref, ":previous")
		latest, err := e.st.ImageID(ctx, repo+":latest")
		if err != nil {
			t.Fatal(err)
		}
		if latest == id {
			t.Fatalf("%s: N's image %s:latest is N−1's (%s): build N first (make images)", sv, repo, id)
		}
	}
	e.agentVersions(t, func(v string) bool { return v == prev }, "the members' agents report N−1")
	e.setup(t)

	start := time.Now()
	before := e.counts()
	var steps []string
	e.withLoad(func() {
		time.Sleep(5 * time.Second)
		for _, sv := range upgradeHub {
			steps = append(steps, e.replace(t, ctx, sv))
			time.Sleep(3 * time.Second)
		}
	})
	hubDone := time.Now()
	gap, gapAt := e.ledger.LongestGap(start, hubDone)
	lost, views := e.settle(t)
	if t.Failed() {
		e.upgradeReport(t, prev, cur, steps, nil)
		t.FailNow()
	}

	// Hub on N, agents on N−1: they still apply. Every grant and revoke the load made while the
	// hub was mixed, and one made now, must reach both members' RoleBindings.
	e.agentVersions(t, func(v string) bool { return v == prev }, "the members' agents still N−1 while the hub is N")
	// Not one of the load's names (u-NNNN), and new on every run.
	skewUser := fmt.Sprintf("u-upgrade-skew-%d", time.Now().Unix())
	granted := time.Now()
	if _, err := e.c.RBAC.BindProjectRole(ctx, connect.NewRequest(&rbacv1.BindProjectRoleRequest{
		Project: RBACProject, Subject: userSubject(skewUser), RoleTemplate: RoleTemplate})); err != nil {
		t.Fatalf("grant %s on the upgraded hub: %v", skewUser, err)
	}
	ex := e.ledger.Expect()
	ex.Granted[skewUser] = true
	e.membersApply(t, ex, "with the hub on N, the N−1 agents apply every grant and revoke")
	skewApplied := time.Since(granted)
	rows := []row{{scenario: "rolling upgrade of the hub", fault: fmt.Sprintf("every hub service's two replicas, then the gateway, replaced one at a time from %s to %s under load", prev, cur),
		figure: fmt.Sprintf("hub replaced in %s (%s); longest time without an acknowledged write %s (from %s into it); refused writes: %s; agents on %s applied the grant made then on both members in %s and every grant and revoke of the upgrade",
			hubDone.Sub(start).Round(time.Second), strings.Join(steps, ", "), gap.Round(100*time.Millisecond), gapAt.Sub(start).Round(time.Second),
			describeRefusals(e.ledger.Refusals(start, hubDone)), prev, skewApplied.Round(100*time.Millisecond)),
		acked: e.counts()[0] - before[0], unknown: e.counts()[2] - before[2], lost: lost, views: views}}

	// The agents last.
	aStart := time.Now()
	before = e.counts()
	var asteps []string
	e.withLoad(func() {
		time.Sleep(3 * time.Second)
		for _, sv := range upgradeAgents {
			asteps = append(asteps, e.replace(t, ctx, sv))
			time.Sleep(3 * time.Second)
		}
	})
	// Not compared with cur: the images may have been built from a tree described otherwise
	// (a commit made since); the containers run N's images (replace checked it), and the
	// heartbeats must come from them.
	newVersion := e.agentVersions(t, func(v string) bool { return v != "" && v != prev }, "the members' agents report another version than N−1's after their upgrade")
	aDone := time.Now()
	lost, views = e.settle(t)
	ex = e.ledger.Expect()
	ex.Granted[skewUser] = true
	applied := e.membersApply(t, ex, "with everything on N, both members' RoleBindings agree with every grant")
	rows = append(rows, row{scenario: "rolling upgrade of the agents", fault: "hosted-agent, east-agent, west-agent replaced one at a time under load",
		figure: fmt.Sprintf("agents replaced and reporting N (%s) in %s (%s); members agreed with every grant %s later; refused writes: %s",
			newVersion, aDone.Sub(aStart).Round(time.Second), strings.Join(asteps, ", "), applied.Round(100*time.Millisecond), describeRefusals(e.ledger.Refusals(aStart, aDone))),
		acked: e.counts()[0] - before[0], unknown: e.counts()[2] - before[2], lost: lost, views: views})
	e.upgradeReport(t, prev, cur, steps, rows)
}

// replace replaces a service's container by one of N's image: stopped (SIGTERM, 10 s grace, as a
// rolling update's pod), removed, created and started with FLEETSTREAM_IMAGE_TAG=latest. It
// waits until the new one is ready and describes how long that took. (Not compose's own
// recreate, `up` of a changed service: docker-compose 1.29 left a stale endpoint on the
// network with it, which fails the teardown's network removal.)
func (e *env) replace(t *testing.T, ctx context.Context, sv string) string {
	t.Helper()
	t0 := time.Now()
	for _, args := range [][]string{{"stop", sv}, {"rm", "-f", sv}, {"up", "-d", "--no-deps", sv}} {
		if _, err := e.st.ComposeRunEnv(ctx, []string{"FLEETSTREAM_IMAGE_TAG=latest"}, args...); err != nil {
			t.Fatalf("replace %s: %v", sv, err)
		}
	}
	replaced := time.Since(t0)
	ref, _, err := e.st.ImageOf(ctx, sv)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(ref, ":latest") {
		t.Fatalf("%s runs %s after its replacement, want N's :latest", sv, ref)
	}
	if upgradeNoAPI[sv] {
		return fmt.Sprintf("%s %s", sv, replaced.Round(100*time.Millisecond))
	}
	ready := e.eventually(t, 2*time.Minute, sv+" on N ready", func(ctx context.Context) error { return e.st.Ready(ctx, sv) })
	return fmt.Sprintf("%s %s+%s ready", sv, replaced.Round(100*time.Millisecond), ready.Round(100*time.Millisecond))
}

// agentVersions waits until both members' agents heartbeat with a version ok accepts and are
// connected.
func (e *env) agentVersions(t *testing.T, ok func(string) bool, what string) (seen string) {
	t.Helper()
	e.eventually(t, 2*time.Minute, what, func(ctx context.Context) error {
		for _, name := range []string{"east", "west"} {
			r, err := e.cluster.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: name}))
			if err != nil {
				return err
			}
			st := r.Msg.GetCluster().GetStatus()
			if seen = st.GetAgentVersion(); !ok(seen) {
				return fmt.Errorf("%s: agent version %q", name, seen)
			}
			if !connected(st) {
				return fmt.Errorf("%s: AgentConnected not true", name)
			}
		}
		return nil
	})
	return seen
}

// membersApply waits until both members' authorizers agree with ex's grants and no RoleBinding
// of a revoked user is left, and returns how long that took.
func (e *env) membersApply(t *testing.T, ex Expected, what string) time.Duration {
	t.Helper()
	ms, err := e.st.Members("east", "west")
	if err != nil {
		t.Fatal(err)
	}
	return e.eventually(t, 3*time.Minute, what, func(ctx context.Context) error {
		var all []string
		for _, m := range ms {
			diffs, _, err := CheckAccess(ctx, m, ex)
			if err != nil {
				return err
			}
			all = append(all, diffs...)
		}
		if len(all) > 0 {
			return fmt.Errorf("%d differences, e.g. %s", len(all), strings.Join(first(all, 5), "; "))
		}
		return nil
	})
}

func describeRefusals(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, n := range m {
		parts = append(parts, fmt.Sprintf("%d× %s", n, oneLine(k)))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

func (e *env) upgradeReport(t *testing.T, prev, cur string, steps []string, rows []row) {
	var b strings.Builder
	fmt.Fprintf(&b, "Rolling upgrade %s → %s", prev, cur)
	if s := os.Getenv("FLEETSTREAM_N1_BUILD_SECONDS"); s != "" {
		fmt.Fprintf(&b, " (N−1's images built in %s s)", s)
	}
	fmt.Fprintf(&b, "\n\n| step | what | figures | acked writes | unknown outcome | acked writes lost | views |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %s |\n", r.scenario, r.fault, r.figure, r.acked, r.unknown, r.lost, r.views)
	}
	if rows == nil {
		fmt.Fprintf(&b, "| failed | %s | | | | | |\n", strings.Join(steps, ", "))
	}
	t.Log("\n" + b.String())
	if p := os.Getenv("FLEETSTREAM_UPGRADE_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Errorf("write report: %v", err)
		}
	}
}
