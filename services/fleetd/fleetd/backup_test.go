package fleetd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/jsm.go"
	jsmbackup "github.com/nats-io/jsm.go/backup"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/backup"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// The whole path on fleetd: a running fleetd backed up over its NATS with the admin token while
// projects keep being created, restored into a new data dir, and started again with the
// original's credentials key. Every project acknowledged before the backup began is there, the
// project and cluster lists equal the original's at the backup's position once the views have
// rebuilt, and the sealed credentials are in the backup only sealed, opening with the key.
func TestBackupOfARunningFleetdRestoresIntoANewOne(t *testing.T) {
	ctx := testkit.Context(t, 3*time.Minute)
	dir := t.TempDir()
	adminToken := filepath.Join(dir, "nats-admin.token")
	if err := os.WriteFile(adminToken, []byte("admin-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgA := fleetd.Config{DataDir: filepath.Join(dir, "a"), Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true},
		NATSListen: "127.0.0.1:0", NATSAdminTokenFile: adminToken}
	a := startData(t, ctx, cfgA)
	projectsA := projectv1connect.NewProjectServiceClient(http.DefaultClient, "http://"+a.Addr)
	clustersA := clusterv1connect.NewClusterServiceClient(http.DefaultClient, "http://"+a.Addr)
	const secret = "tok-Sekr1t-backup"
	if _, err := clustersA.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "hosted",
		Credentials: &clusterv1.ConnectionCredentials{Server: "https://10.0.0.1:6443", Token: secret}})); err != nil {
		t.Fatal(err)
	}
	agentTokens := map[string]string{}
	for i := range 3 {
		name := fmt.Sprintf("c%d", i)
		reg, err := clustersA.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name,
			Labels: map[string]string{"env": "prod"}}))
		if err != nil {
			t.Fatal(err)
		}
		agentTokens[name] = reg.Msg.AgentToken
	}

	// Projects are created all along; each creation acknowledged is recorded with its time.
	type created struct {
		name string
		at   time.Time
	}
	var (
		mu   sync.Mutex
		done []created
	)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := 0; loadCtx.Err() == nil; i++ {
				name := fmt.Sprintf("p%d-%d", w, i)
				if _, err := projectsA.CreateProject(loadCtx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: name})); err == nil {
					mu.Lock()
					done = append(done, created{name, time.Now()})
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond)

	// The operator's connection: the admin token over TCP, as fleetctl admin backup makes it. It
	// may snapshot every stream, and not publish on any stream's subject.
	adminErrs := make(chan error, 1)
	nc, err := nats.Connect(a.NATS.ClientURL(), nats.Token("admin-token-0123456789abcdef"),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.AdminUser)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case adminErrs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("fleet.cluster.c0", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-adminErrs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("admin publishing an event: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the admin token published on fleet.cluster.c0 unrefused")
	}
	if _, err := nats.Connect(a.NATS.ClientURL(), nats.Token("admin-token-0123456789abcdeX")); err == nil {
		t.Fatal("a wrong admin token connected")
	}
	bdir := filepath.Join(dir, "backup")
	started := time.Now()
	m, err := backup.Backup(ctx, nc, bdir, backup.Options{Version: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	stopLoad()
	wg.Wait()
	pos := map[string]uint64{}
	msgs := map[string]uint64{}
	for _, s := range m.Streams {
		pos[s.Name] = s.LastSeq
		msgs[s.Name] = s.Msgs
	}
	// Every view's bucket holds at least its checkpoint: a snapshot torn by the checkpoint's
	// rewrites (pkg/backup) lost it, and the restored hub rebuilt the view under its readers.
	for _, p := range slices.Concat(clusterimport.Projections(), namespacebinding.Projections(), rbacsync.Projections(), collector.Projections()) {
		if name := "KV_" + p.Bucket.Bucket; msgs[name] == 0 {
			t.Errorf("backup of view %s: stream %s holds no message, not even the view's checkpoint", p.Name, name)
		}
	}
	for _, want := range []string{subjects.ClusterStream, subjects.NamespaceStream, "KV_clusters", subjects.AuditStream} {
		if _, ok := pos[want]; !ok {
			t.Errorf("backup lacks stream %s (has %v)", want, slices.Sorted(mapsKeys(pos)))
		}
	}

	// The original's lists at the backup's position: the entries whose last event the backup
	// holds (the load only creates, so nothing in them changed after).
	listProjects := func(c projectv1connect.ProjectServiceClient) []*projectv1.Project {
		res, err := c.ListProjects(ctx, connect.NewRequest(&projectv1.ListProjectsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.Projects
	}
	var wantProjects []*projectv1.Project
	for _, p := range listProjects(projectsA) {
		if p.Revision <= pos[subjects.NamespaceStream] {
			wantProjects = append(wantProjects, p)
		}
	}
	if len(wantProjects) == len(listProjects(projectsA)) {
		t.Fatal("no project was created after the backup: the backup was not taken under load")
	}
	clustersRes, err := clustersA.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	wantClusters := clustersRes.Msg.Clusters
	a.Stop()

	// Sealed credentials are in the backup only sealed: neither the token nor the key is in
	// any message of any stream.
	key, err := os.ReadFile(fleetd.DefaultCredentialsKeyFile(cfgA.DataDir))
	if err != nil {
		t.Fatal(err)
	}
	_, keyB64, _ := strings.Cut(strings.TrimSpace(lastLine(string(key))), ":")
	for _, s := range m.Streams {
		scanArchive(t, filepath.Join(bdir, backup.StreamsDir, s.Name), [][]byte{[]byte(secret), []byte(keyB64)})
	}

	// Restore into a new data dir, offline; a second restore onto it is refused.
	cfgB := cfgA
	cfgB.DataDir = filepath.Join(dir, "b")
	cfgB.NATSAdminTokenFile = ""
	cfgB.CredentialsKeyFile = fleetd.DefaultCredentialsKeyFile(cfgA.DataDir)
	if _, err := fleetd.Restore(ctx, fleetd.RestoreConfig{DataDir: cfgB.DataDir, From: bdir}, testkit.Logger(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := fleetd.Restore(ctx, fleetd.RestoreConfig{DataDir: cfgB.DataDir, From: bdir}, testkit.Logger(t)); !errors.Is(err, backup.ErrExists) {
		t.Fatalf("restore onto a data dir holding the streams: %v", err)
	}
	b := startData(t, ctx, cfgB)
	projectsB := projectv1connect.NewProjectServiceClient(http.DefaultClient, "http://"+b.Addr)
	clustersB := clusterv1connect.NewClusterServiceClient(http.DefaultClient, "http://"+b.Addr)
	gotProjects := listProjects(projectsB)
	if !equalMessages(wantProjects, gotProjects) {
		t.Errorf("projects after the restore differ from the original's at the backup's position:\nwant %d %v\ngot  %d %v",
			len(wantProjects), names(wantProjects), len(gotProjects), names(gotProjects))
	}
	mu.Lock()
	for _, c := range done {
		if c.at.Before(started) && !slices.ContainsFunc(gotProjects, func(p *projectv1.Project) bool { return p.Name == c.name }) {
			t.Errorf("project %s, created before the backup began, is missing after the restore", c.name)
		}
	}
	mu.Unlock()
	res, err := clustersB.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !equalMessages(wantClusters, res.Msg.Clusters) {
		t.Errorf("clusters after the restore differ:\nwant %v\ngot  %v", wantClusters, res.Msg.Clusters)
	}
	// Every view of the restored hub equals its rebuild from the restored streams.
	for _, p := range slices.Concat(clusterimport.Projections(), namespacebinding.Projections(), rbacsync.Projections(), collector.Projections()) {
		v, err := view.Verify(ctx, b.JS, p)
		if err != nil {
			t.Fatalf("verify view %s: %v", p.Name, err)
		}
		if !v.Equal() {
			t.Errorf("view %s after the restore differs from its rebuild: %d mismatches, first %+v", p.Name, len(v.Mismatches), v.Mismatches[0])
		}
	}

	// Agents reconnect to the restored hub with the tokens they were given; a made-up one does
	// not get in.
	for name, token := range agentTokens {
		anc, err := connectAgent(b, name, token, make(chan error, 1))
		if err != nil {
			t.Errorf("agent of %s with its token, after the restore: %v", name, err)
			continue
		}
		anc.Close()
	}
	if anc, err := connectAgent(b, "c0", "not-a-token", make(chan error, 1)); err == nil {
		anc.Close()
		t.Error("an unknown agent token connected to the restored hub")
	}
	b.Stop()

	// The restored credentials open with the original key, and only with it.
	rot, err := fleetd.RotateCredentialsKey(ctx, fleetd.RotateConfig{DataDir: cfgB.DataDir, KeyFile: copyFile(t, cfgB.CredentialsKeyFile), NewKey: true}, testkit.Logger(t))
	if err != nil || rot.Report.Total() != 1 {
		t.Fatalf("reseal the restored credentials with the original key: %v %+v", err, rot)
	}
}

// startData starts fleetd and waits until it is ready. A fleetd whose services stopped (one
// returned an error, which stops them all) never gets ready: that is reported at once with the
// error, not as a timeout; a timeout reports which readiness checks were pending.
func startData(t *testing.T, ctx context.Context, cfg fleetd.Config) *fleetd.Instance {
	t.Helper()
	inst, err := fleetd.Start(ctx, cfg, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Stop)
	stopped := make(chan error, 1)
	go func() { stopped <- inst.Wait() }()
	select {
	case <-inst.Ready():
	case err := <-stopped:
		t.Fatalf("fleetd stopped before it was ready: %v", err)
	case <-ctx.Done():
		t.Fatalf("fleetd not ready; /readyz: %s", readyz(inst.Addr))
	}
	return inst
}

// readyz returns what fleetd's /readyz answers: each check, and why one is not ready.
func readyz(addr string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return err.Error()
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = res.Body.Close() }()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return err.Error()
	}
	return res.Status + "\n" + string(body)
}

func mapsKeys(m map[string]uint64) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func names(ps []*projectv1.Project) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

func equalMessages[M proto.Message](a, b []M) bool {
	return slices.EqualFunc(a, b, func(x, y M) bool { return proto.Equal(x, y) })
}

func copyFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(out, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// scanArchive decodes a stream's archive and fails if any message holds one of secrets.
func scanArchive(t *testing.T, dir string, secrets [][]byte) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, jsm.SnapshotDataFile))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	dec := jsmbackup.NewDecoder(f)
	for {
		item, err := dec.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		msg, ok := item.(*jsmbackup.Message)
		if !ok {
			continue
		}
		body, err := io.ReadAll(msg.Body)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			if len(s) > 0 && bytes.Contains(body, s) {
				t.Errorf("%s: message %d on %s holds a secret in the clear", dir, msg.Seq, msg.Subject)
			}
		}
	}
}

// The admin token must be a real secret: a missing or short one stops fleetd at start.
func TestNATSAdminTokenFileIsChecked(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{short: "use at least 16", filepath.Join(dir, "missing"): "no such file"} {
		cfg := fleetd.Config{DataDir: filepath.Join(t.TempDir(), "d"), Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true},
			NATSListen: "127.0.0.1:0", NATSAdminTokenFile: file}
		inst, err := fleetd.Start(context.Background(), cfg, testkit.Logger(t))
		if err == nil {
			inst.Stop()
			t.Fatalf("fleetd started with admin token file %s", file)
		}
		if !strings.Contains(err.Error(), "--nats-admin-token-file") || !strings.Contains(err.Error(), want) {
			t.Errorf("admin token file %s: %v", file, err)
		}
	}
}
