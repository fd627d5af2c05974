package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// fleetctl admin backup and restore against real JetStream servers: the flags and the
// environment reach NATS, the output names every stream, and a second restore is refused with
// exit 1 and a pointer to --force.
func TestAdminBackupAndRestore(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	src := testkit.StartJetStream(t)
	if _, err := src.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "FLEET_X", Subjects: []string{"x.>"}}); err != nil {
		t.Fatal(err)
	}
	kv, err := src.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "things"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := src.JS.Publish(ctx, "x.y", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx, "a", []byte("b")); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Run(context.Background(), IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}, args)
		return code, out.String(), errOut.String()
	}
	dir := filepath.Join(t.TempDir(), "b")
	code, out, errOut := run("admin", "backup", dir, "--nats-url", src.Server.ClientURL())
	if code != 0 || !strings.Contains(out, "KV_things") || !strings.Contains(out, "FLEET_X ") || !strings.Contains(out, "backed up 2 streams") {
		t.Fatalf("backup: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "manifest.json")); err != nil {
		t.Fatal(err)
	}

	dst := testkit.StartJetStream(t)
	t.Setenv("FLEETSTREAM_NATS_URL", dst.Server.ClientURL()) // the environment, as the services read it
	code, out, errOut = run("admin", "restore", dir)
	if code != 0 || !strings.Contains(out, "restored 2 streams") {
		t.Fatalf("restore: exit %d\n%s%s", code, out, errOut)
	}
	st, err := dst.JS.Stream(ctx, "FLEET_X")
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := st.Info(ctx); info.State.Msgs != 10 {
		t.Errorf("restored FLEET_X holds %d messages", info.State.Msgs)
	}
	code, out, errOut = run("admin", "restore", dir)
	if code != 1 || out != "" || !strings.Contains(errOut, "FLEET_X") || !strings.Contains(errOut, "--force") {
		t.Fatalf("second restore: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut = run("admin", "restore", dir, "--force"); code != 0 {
		t.Fatalf("forced restore: %s", errOut)
	}
}
