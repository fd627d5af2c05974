package fleetd_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/sealed"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// The laptop path: fleetd creates its credentials key in the data dir, and
// `fleetd rotate-credentials-key` rotates it on the stopped data dir.
func TestCredentialsKeyIsCreatedAndRotatedOnTheDataDir(t *testing.T) {
	ctx := testkit.Context(t, 120*time.Second)
	dir := filepath.Join(t.TempDir(), "data")
	cfg := fleetd.Config{DataDir: dir, Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true}, NATSListen: "127.0.0.1:0"}
	start := func() *fleetd.Instance {
		t.Helper()
		inst, err := fleetd.Start(ctx, cfg, testkit.Logger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(inst.Stop)
		select {
		case <-inst.Ready():
		case <-ctx.Done():
			t.Fatal("fleetd not ready")
		}
		return inst
	}
	inst := start()
	keyFile := fleetd.DefaultCredentialsKeyFile(dir)
	if st, err := os.Stat(keyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	first, err := sealed.LoadKeyring(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	creds := &clusterv1.ConnectionCredentials{Server: "https://10.0.0.1:6443", Token: "tok-Sekr1t-fleetd"}
	client := clusterv1connect.NewClusterServiceClient(http.DefaultClient, "http://"+inst.Addr)
	if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1", Credentials: creds})); err != nil {
		t.Fatal(err)
	}

	// While fleetd runs, neither a second fleetd nor a rotation may open its data dir.
	if second, err := fleetd.Start(ctx, cfg, testkit.Logger(t)); err == nil || !strings.Contains(err.Error(), "in use") {
		if second != nil {
			second.Stop()
		}
		t.Fatalf("second fleetd on the data dir: %v", err)
	}
	if _, err := fleetd.RotateCredentialsKey(ctx, fleetd.RotateConfig{DataDir: dir, NewKey: true}, testkit.Logger(t)); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("rotation while fleetd runs: %v", err)
	}
	if r, _ := sealed.LoadKeyring(keyFile); len(r.IDs()) != 1 {
		t.Fatalf("refused rotation changed the key file: %v", r.IDs())
	}
	inst.Stop()

	res, err := fleetd.RotateCredentialsKey(ctx, fleetd.RotateConfig{DataDir: dir, NewKey: true}, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if res.AddedKeyID == "" || res.AddedKeyID == first.ActiveID() || res.Report.ActiveKeyID != res.AddedKeyID ||
		res.Report.Resealed[first.ActiveID()] != 1 || res.Report.Total() != 1 || !slices.Equal(res.OldKeyIDs, []string{first.ActiveID()}) {
		t.Fatalf("rotation: %+v", res)
	}
	if strings.Contains(res.Report.String(), creds.Token) {
		t.Fatal("report shows a credential")
	}

	// Delete the old key's line: everything still opens after a restart.
	data, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.SplitAfter(string(data), "\n") {
		if !strings.HasPrefix(l, first.ActiveID()+":") {
			kept = append(kept, l)
		}
	}
	if err := os.WriteFile(keyFile, []byte(strings.Join(kept, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := sealed.LoadKeyring(keyFile); err != nil || !slices.Equal(r.IDs(), []string{res.AddedKeyID}) {
		t.Fatalf("key file after removing the old key: %v %v", r, err)
	}
	inst = start()
	got, err := inst.ClusterImport.Credentials(ctx, "c1")
	if err != nil || !proto.Equal(got, creds) {
		t.Fatalf("credentials after rotation and restart: %v", err)
	}
}

func TestGivenCredentialsKeyFileMustExist(t *testing.T) {
	dir := t.TempDir()
	_, err := fleetd.Start(context.Background(), fleetd.Config{
		DataDir: filepath.Join(dir, "data"), CredentialsKeyFile: filepath.Join(dir, "typo.key"),
		Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true}, NATSListen: "127.0.0.1:0",
	}, testkit.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "--credentials-key-file") {
		t.Fatalf("got %v", err)
	}
}
