package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// WatchWritable's probe is answered "wrong last sequence" by a bucket with a leader and stores
// nothing; a bucket that does not answer (here: none by that name) is never reported writable.
func TestWatchWritableProbesWithoutWriting(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 30*time.Second)
	kv, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "probed"})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	got := (&Stack{}).WatchWritable(ctx, []*nats.Conn{j.Conn}, []string{"KV_probed", "KV_absent", "FLEET_X"}, t0, 2*time.Second)
	if d, ok := got["KV_probed"]; !ok || d > time.Second {
		t.Fatalf("KV_probed writable after %v (%v), want at once", d, ok)
	}
	if _, ok := got["KV_absent"]; ok {
		t.Fatal("a bucket that does not exist was reported writable")
	}
	if _, ok := got["FLEET_X"]; ok {
		t.Fatal("a stream (not probed) was reported writable")
	}
	if _, err := kv.Get(context.Background(), "chaos-probe"); err == nil {
		t.Fatal("the probe stored its key")
	}
}
