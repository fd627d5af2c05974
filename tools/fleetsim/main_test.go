package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// The simulator end to end at 20 clusters against an in-process fleetd: every cluster
// registered and Connected, and in a grant round every cluster's agent applied the RoleBinding
// and removed it again on revoke, while five more clusters misbehave (one of each kind). Nothing
// may be lost, and each misbehaving cluster must show on the hub.
func TestTwentyClustersJoinAndGrant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts fleetd and 20 simulated agents")
	}
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"-clusters", "20", "-namespaces", "3", "-heartbeat", "1s", "-ramp", "0",
		"-rounds", "1", "-timeout", "60s", "-log-level", "error", "-scenario", "join,grant,steady", "-idle", "1s",
		"-misbehave", "reconnect=1,flood=1,inventory=1,foreign=1,noack=1"}, &stdout, &stderr)
	t.Log(stderr.String())
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, stdout.String())
	}
	if len(res.Lost) > 0 {
		t.Fatalf("lost: %v", res.Lost)
	}
	// Join counts the misbehaving clusters too; grant times the well-behaved only.
	if res.Join == nil || res.Join.Register.N != n+5 || res.Join.Connected.N != n+5 || res.Join.AllConnectedMS <= 0 {
		t.Fatalf("join: not every cluster registered and Connected: %+v", res.Join)
	}
	if res.Grant == nil || len(res.Grant.Rounds) != 1 || res.Grant.Measured != n || res.Grant.Grant.N != n || res.Grant.Revoke.N != n {
		t.Fatalf("grant: not every cluster applied and removed the RoleBinding: %+v", res.Grant)
	}
	// The misbehaving clusters converged anyway, and what they tried shows: the foreign one
	// was refused by NATS, the flooding one stands out on /metrics, the huge inventory is on
	// the cluster, and the silent one's binding is not shown applied (else they are in Lost).
	if len(res.Misbehaving) != 5 {
		t.Fatalf("misbehaving: %+v", res.Misbehaving)
	}
	for _, m := range res.Misbehaving {
		if m.Converged != 1 || (m.Kind == misForeign && m.Refused == 0) || (m.Kind == misFlood && m.HeartbeatRatio < 2) ||
			(m.Kind == misInventory && m.NamespaceCount < bigInventory && !m.OutOfLimits) ||
			(m.Kind == misNoAck && !strings.HasPrefix(m.BindingPhase, "PENDING")) {
			t.Fatalf("misbehaving %s: %+v", m.Kind, m)
		}
	}
	if st := res.Steady; st == nil || st.IdleSeconds < 1 || st.HubCPUPercent <= 0 || st.HubRSSMB <= 0 {
		t.Fatalf("steady: the idle fleet was not measured: %+v", res.Steady)
	}
	// Below minP99Samples there is no p99, only the maximum, and the table says so.
	if res.Grant.Grant.P99 != nil || !strings.Contains(stderr.String(), "max of 20") {
		t.Fatalf("a p99 of %d samples was reported: %+v", n, res.Grant.Grant)
	}
}

// A namespace follows a placement that selects clusters by a label: when every cluster's label
// flips, the clusters that left the decision delete it (unbind policy DELETE) and those that
// joined apply it; and EndpointSlices reported by every agent are served by GetServiceEndpoints
// and reach an xDS client after an update. The results line is what the plot reads.
func TestPlacementAndEndpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("starts fleetd and 10 simulated agents")
	}
	const n = 10
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	results := filepath.Join(t.TempDir(), "results.jsonl")
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"-clusters", "10", "-namespaces", "2", "-heartbeat", "1s", "-ramp", "0",
		"-rounds", "2", "-timeout", "45s", "-log-level", "error", "-scenario", "join,placement,endpoints", "-services", "3",
		"-results", results}, &stdout, &stderr)
	t.Log(stderr.String())
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Lost) > 0 {
		t.Fatalf("lost: %v", res.Lost)
	}
	// Two rounds, half the fleet joining and half leaving in each.
	if p := res.Placement; p == nil || len(p.Rounds) != 2 || p.Measured != n || p.Selected.N != n || p.Deselected.N != n || p.BindAllAppliedMS <= 0 {
		t.Fatalf("placement: %+v", res.Placement)
	}
	if e := res.Endpoints; e == nil || len(e.Rounds) != 2 || e.Served.N != 2*n || e.XDS.N != 2*n || e.LoadAllServedMS <= 0 {
		t.Fatalf("endpoints: %+v", res.Endpoints)
	}
	b, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	var line Result
	if err := json.Unmarshal(b, &line); err != nil || line.Clusters != n || line.Placement == nil {
		t.Fatalf("results line: %v %s", err, b)
	}
}

func TestOptionsRefuseBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-clusters", "0"}, "-clusters"},
		{[]string{"-scenario", "join,crash"}, `unknown scenario "crash"`},
		{[]string{"-scenario", "grant"}, "grant and steady need join"},
		{[]string{"-scenario", "steady"}, "grant and steady need join"},
		{[]string{"-scenario", "join,grant,storm"}, "storm needs grant"},
		{[]string{"-scenario", "join,storm", "-fleetd", "bin/fleetd"}, "storm needs grant"},
		{[]string{"-scenario", "join,grant,storm", "-fleetd", "bin/fleetd", "-storm-cmd", "true"}, "one of -fleetd"},
		{[]string{"-idle", "0s"}, "-idle"},
		{[]string{"-scenario", "placement"}, "placement and endpoints need join"},
		{[]string{"-services", "0"}, "-services"},
		{[]string{"-misbehave", "flood"}, "not kind=N"},
		{[]string{"-misbehave", "flood=0"}, "not kind=N"},
		{[]string{"-misbehave", "sleepy=1"}, `unknown kind "sleepy"`},
		{[]string{"-hub-profile", "x.pprof", "-scenario", "join,steady"}, "-hub-profile needs -fleetd"},
		{[]string{"-storm-profile", "x.pprof", "-scenario", "join,grant,storm", "-storm-cmd", "true"}, "-storm-profile needs -fleetd"},
		{[]string{"-storm-profile", "x.pprof", "-scenario", "join,grant", "-fleetd", "bin/fleetd"}, "-storm-profile needs -fleetd and the storm scenario"},
		{[]string{"-rounds", "0"}, "-rounds"},
		{[]string{"-heartbeat", "0s"}, "-heartbeat"},
		{[]string{"-ramp", "-1"}, "-ramp"},
		{[]string{"-embedded=false", "-api-url", "http://x"}, "-nats-url and -token-file"},
	} {
		_, err := parseOptions(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

func TestDistReportsP99OnlyFromEnoughSamples(t *testing.T) {
	few := make([]time.Duration, minP99Samples-1)
	many := make([]time.Duration, minP99Samples)
	for i := range many {
		many[i] = time.Duration(i+1) * time.Millisecond
		if i < len(few) {
			few[i] = many[i]
		}
	}
	if d := newDist(few); d.P99 != nil || d.Max != float64(len(few)) || !strings.HasPrefix(d.tail(), "max of 199") {
		t.Errorf("199 samples: %+v %q", d, d.tail())
	}
	if d := newDist(many); d.P99 == nil || *d.P99 != 198 || d.P50 != 100 {
		t.Errorf("200 samples: %+v", d)
	}
}

// Without -embedded the simulator drives a hub it did not start, by URL and admin token.
func TestAgainstARunningHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts fleetd and simulated agents")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("ops-token,ops\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminToken := filepath.Join(dir, "admin.token")
	if err := os.WriteFile(adminToken, []byte("ops-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inst, err := fleetd.Start(ctx, fleetd.Config{
		DataDir:    filepath.Join(dir, "data"),
		Server:     server.Config{Listen: "127.0.0.1:0", TokenFile: tokens},
		NATSListen: "127.0.0.1:0",
		Authz:      authz.Config{PlatformAdmins: []string{"ops"}},
	}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Stop()
	<-inst.Ready()
	var stdout, stderr bytes.Buffer
	err = run(ctx, []string{"-embedded=false", "-api-url", "http://" + inst.Addr, "-nats-url", inst.NATS.ClientURL(),
		"-token-file", adminToken, "-clusters", "5", "-ramp", "0", "-rounds", "1", "-timeout", "30s"}, &stdout, &stderr)
	t.Log(stderr.String())
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Join.Connected.N != 5 || res.Grant.Measured != 5 || len(res.Lost) > 0 || !strings.HasPrefix(res.Hub, "http://") {
		t.Fatalf("result %+v", res)
	}
}
