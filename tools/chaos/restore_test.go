//go:build chaos

package chaos

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
)

// restoreFromBackup is issue 31's restore on the compose stack: `fleetctl admin backup` while the
// load runs, every NATS node replaced by an empty one (its storage volume deleted), `fleetctl
// admin restore --replicas 3`, the hub services started again. The members' apiservers and
// agents keep running throughout, as they would in their own clusters. Then:
//   - what the API serves of the load's objects is what the backup holds by the ledger (writes
//     acknowledged before the backup started there, writes sent after it ended absent, only the
//     writes in flight meanwhile either way): ListNamespaceBindings and ListProjectRoleBindings
//     as the original served them at the backup's position;
//   - everything else the original listed (clusters with their labels, projects, the RBAC
//     project's bindings with their ids) is listed as before;
//   - both member clusters' agents reconnect with the tokens they have (a heartbeat received
//     after the restore began, AgentConnected true);
//   - every view equals its rebuild from the restored streams;
//   - the restored hub takes writes, and the grants among them reach both members' RoleBindings.
func (e *env) restoreFromBackup(t *testing.T) {
	ctx := ctxFor(t, 20*time.Minute)
	dir := filepath.Join(e.st.Root, ".data", "chaos-backup")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	was, err := e.listing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := e.counts()

	var start, end time.Time
	var backupOut string
	e.withLoad(func() {
		time.Sleep(3 * time.Second)
		start = time.Now()
		backupOut, err = e.st.Fleetctl(ctx, append([]string{"admin", "backup", dir}, e.st.AdminNATSFlags()...)...)
		end = time.Now()
		if err != nil {
			t.Fatalf("fleetctl admin backup: %v\n%s", err, backupOut)
		}
		// Writes acknowledged after the backup ended: the restored hub must not have them.
		time.Sleep(3 * time.Second)
	})
	t.Logf("fleetctl admin backup:\n%s", backupOut)
	at := e.ledger.ExpectAtBackup(start, end)
	size, err := dirSize(dir)
	if err != nil {
		t.Fatal(err)
	}

	// The lost NATS: every hub service stopped, every node's storage deleted, empty nodes started.
	hub, err := e.st.HubServices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.ComposeRun(ctx, append([]string{"stop"}, hub...)...); err != nil {
		t.Fatal(err)
	}
	var vols []string
	for _, n := range NATSNodes {
		v, err := e.st.Volume(ctx, n, "/data")
		if err != nil {
			t.Fatal(err)
		}
		vols = append(vols, v)
	}
	if _, err := e.st.ComposeRun(ctx, append([]string{"rm", "-f", "-s"}, NATSNodes...)...); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Docker(ctx, append([]string{"volume", "rm"}, vols...)...); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.ComposeRun(ctx, append([]string{"up", "-d", "--no-deps"}, NATSNodes...)...); err != nil {
		t.Fatal(err)
	}
	e.eventually(t, 2*time.Minute, "the empty NATS nodes healthy", func(ctx context.Context) error {
		for _, n := range NATSNodes {
			if !e.st.NATSHealthy(ctx, n) {
				return fmt.Errorf("%s not healthy", n)
			}
		}
		return nil
	})
	if ss, err := e.st.StreamLeaders(ctx); err == nil && len(ss) > 0 {
		t.Fatalf("the new NATS holds streams before the restore: %v", ss)
	}

	restoreAt := time.Now()
	restoreOut, err := e.st.Fleetctl(ctx, append([]string{"admin", "restore", dir, "--replicas", "3"}, e.st.AdminNATSFlags()...)...)
	restoreTook := time.Since(restoreAt)
	if err != nil {
		t.Fatalf("fleetctl admin restore: %v\n%s", err, restoreOut)
	}
	t.Logf("fleetctl admin restore:\n%s", restoreOut)
	t1 := time.Now()
	if _, err := e.st.ComposeRun(ctx, append([]string{"start"}, hub...)...); err != nil {
		t.Fatal(err)
	}
	ready := e.eventually(t, 3*time.Minute, "the gateway ready on the restored NATS", e.st.GatewayReady)

	// The original's listing at the backup's position, the load's objects apart.
	static := func(listing string) string {
		var keep []string
		for _, l := range strings.Split(listing, "\n") {
			if !strings.HasPrefix(l, "binding "+NSProject+" ") && !strings.HasPrefix(l, "grant ") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	e.eventually(t, 3*time.Minute, "the API serves what the backup holds", func(ctx context.Context) error {
		now, err := e.listing(ctx)
		if err != nil {
			return err
		}
		if static(now) != static(was) {
			return fmt.Errorf("listing differs from the original's:\nwas:\n%s\nnow:\n%s", static(was), static(now))
		}
		weights, err := e.st.Weights(ctx)
		if err != nil {
			return err
		}
		diffs, err := CheckAtBackup(ctx, e.c, at, weights)
		if err != nil {
			return err
		}
		if len(diffs) > 0 {
			return fmt.Errorf("%d differences from what the backup holds, e.g.:\n  %s", len(diffs), strings.Join(first(diffs, 20), "\n  "))
		}
		return nil
	})
	served := time.Since(t1)
	reconnected := e.eventually(t, 3*time.Minute, "both member clusters' agents reconnected with their tokens", func(ctx context.Context) error {
		for _, name := range []string{"east", "west"} {
			r, err := e.cluster.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: name}))
			if err != nil {
				return err
			}
			st := r.Msg.GetCluster().GetStatus()
			// A heartbeat from before the backup would say Connected too: the restored status
			// counts only once a heartbeat came in after the restore began.
			if seen := st.GetLastSeen().AsTime(); !seen.After(restoreAt) {
				return fmt.Errorf("%s: last heartbeat %s, before the restore began (%s)", name, seen.Format(time.RFC3339), restoreAt.Format(time.RFC3339))
			}
			if !connected(st) {
				return fmt.Errorf("%s: AgentConnected not true", name)
			}
		}
		return nil
	})
	vs, vdiffs, err := e.st.VerifyViews(ctx)
	if err != nil {
		t.Fatalf("verify views: %v", err)
	}
	if len(vdiffs) > 0 {
		t.Fatalf("%d view entries differ from a rebuild from the restored streams, e.g.:\n  %s", len(vdiffs), strings.Join(first(vdiffs, 20), "\n  "))
	}
	entries := 0
	for _, v := range vs {
		entries += v.Entries
	}
	acked, oldUnknown := e.counts()[0]-before[0], e.counts()[2]-before[2]

	// The restored hub takes writes: a new ledger from here (the old one records writes the
	// restore dropped by design), checked as after every scenario, and its grants and revokes
	// applied by both members' agents.
	e.ledger = &Ledger{}
	e.load.Ledger = e.ledger
	e.withLoad(func() { time.Sleep(10 * time.Second) })
	lost, views := e.settle(t)
	ms, err := e.st.Members("east", "west")
	if err != nil {
		t.Fatal(err)
	}
	ex := e.ledger.Expect()
	applied := e.eventually(t, 3*time.Minute, "both members' RoleBindings agree with the grants after the restore", func(ctx context.Context) error {
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
	after, _, unknown := e.ledger.Counts()
	fig := fmt.Sprintf("backup %s (%d bytes, %d objects the backup may hold either way (writes in flight meanwhile or of unknown outcome)); NATS replaced and restored with 3 replicas in %s; gateway ready %s after the services started, "+
		"the backup's listing served %s after they started (%d objects the load did not touch equal; the load's bindings, grants and weight as the ledger says the backup holds); "+
		"agents heartbeating again %s after that; %d views (%d entries) = rebuild from the restored streams; then %d writes acknowledged (%d unknown) in 10 s and their %d grants and revokes applied on both members %s later",
		(end.Sub(start)).Round(10*time.Millisecond), size, at.Uncertain(), restoreTook.Round(10*time.Millisecond), ready.Round(time.Second),
		served.Round(time.Second), strings.Count(static(was), "\n")+1, reconnected.Round(time.Second), len(vs), entries, after, unknown, len(ex.Granted), applied.Round(time.Second))
	e.rows = append(e.rows, row{scenario: "restore from a backup", fault: "fleetctl admin backup under load; every NATS node's storage deleted; fleetctl admin restore --replicas 3 onto empty nodes",
		figure: fig, acked: acked, unknown: oldUnknown, lost: lost, views: views})
	t.Logf("restore from a backup: %s; lost %d; %s", fig, lost, views)
}

func connected(st *clusterv1.ClusterStatus) bool {
	for _, c := range st.GetConditions() {
		if c.GetType() == "AgentConnected" {
			return c.GetStatus() == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE
		}
	}
	return false
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("backup %s: %w", dir, err)
	}
	return n, err
}
