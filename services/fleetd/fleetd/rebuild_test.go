package fleetd_test

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// What made a fleetd restored from a backup never get ready under load: its ns-bindings view
// came back without its checkpoint (a torn snapshot, see pkg/backup), and the view's lease of
// the backed-up fleetd was still in the restored lease bucket. namespace-binding therefore
// rebuilt the view (dropping its bucket) only once that lease had timed out, seconds after
// rbac-sync had attached to the bucket; rbac-sync's reader failed with "stream not found",
// which stopped every service of the process. Here the same start: a data dir whose view lacks
// its checkpoint and whose lease another holder has just written. fleetd must get ready.
func TestFleetdGetsReadyWhenTheNamespaceBindingsViewIsRebuiltLate(t *testing.T) {
	ctx := testkit.Context(t, 2*time.Minute)
	cfg := fleetd.Config{DataDir: filepath.Join(t.TempDir(), "d"),
		Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true}, NATSListen: "127.0.0.1:0"}
	first := startData(t, ctx, cfg)
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, "http://"+first.Addr)
	if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "p1"})); err != nil {
		t.Fatal(err)
	}
	kv, err := first.JS.KeyValue(ctx, subjects.NamespaceBindingsBucket)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := first.JS.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	// Another holder's lease (the running engine stands by), then no checkpoint; stopped before
	// any event could make the engine notice.
	if _, err := leases.Put(ctx, "view.ns-bindings", []byte("backed-up-fleetd/1#000000000000")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, view.MetaKey); err != nil {
		t.Fatal(err)
	}
	first.Stop()

	second := startData(t, ctx, cfg) // fails at once if a service stops it
	// It rebuilt the view, and goes on serving once it has.
	testkit.Eventually(t, 30*time.Second, func() error {
		kv, err := second.JS.KeyValue(ctx, subjects.NamespaceBindingsBucket)
		if err != nil {
			return err
		}
		_, err = kv.Get(ctx, view.MetaKey)
		return err
	})
	time.Sleep(2 * time.Second) // the readers of the dropped bucket have noticed
	projects = projectv1connect.NewProjectServiceClient(http.DefaultClient, "http://"+second.Addr)
	if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "p2"})); err != nil {
		t.Fatalf("fleetd after the view's rebuild: %v", err)
	}
}
