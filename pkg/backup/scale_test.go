package backup_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/backup"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// TestBackupScale measures a backup and a restore of a store of BACKUP_EVENTS events (make
// backup-scale: 1,000,000) of about 400 bytes each, on 10,000 aggregates, with a view-sized KV
// bucket of 10,000 keys beside it; skipped unless BACKUP_EVENTS is set. The figures are in
// docs/operations.md.
func TestBackupScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("BACKUP_EVENTS"))
	if n <= 0 {
		t.Skip("set BACKUP_EVENTS (make backup-scale) to measure")
	}
	ctx := testkit.Context(t, 30*time.Minute)
	src := testkit.StartJetStream(t)
	if _, err := src.JS.CreateStream(ctx, topology.EventStream("FLEET_SCALE", "scale events", "fleet.scale.>")); err != nil {
		t.Fatal(err)
	}
	kv, err := src.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "scale-view"})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	fill := time.Now()
	const window = 2000 // below PublishAsync's default of 4,000 outstanding
	var pending []jetstream.PubAckFuture
	for i := range n {
		agg := i % 10_000
		// Shaped like an event envelope: ids, a type, an actor, a time and a payload of labels.
		body := fmt.Sprintf(`{"id":"%016x%016x","type":"fleetstream.cluster.v1.ClusterUpdated","aggregate":"c-%05d","actor":"alice@example.com","time":"%s","payload":{"labels":{"env":"prod","region":"eu-west-%d","tier":"gold","team":"team-%03d"},"revision":%d,"note":"%016x"}}`,
			rng.Uint64(), rng.Uint64(), agg, time.Unix(1_790_000_000+int64(i), 0).UTC().Format(time.RFC3339Nano), agg%3, agg%200, i, rng.Uint64())
		f, err := src.JS.PublishAsync(fmt.Sprintf("fleet.scale.c-%05d", agg), []byte(body), jetstream.WithMsgID(strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, f)
		if len(pending) == window {
			for _, f := range pending {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					t.Fatal(err)
				}
			}
			pending = pending[:0]
		}
	}
	for _, f := range pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		}
	}
	for i := range 10_000 {
		if _, err := kv.Put(ctx, fmt.Sprintf("c-%05d", i), make([]byte, 600)); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := src.JS.Stream(ctx, "FLEET_SCALE")
	info, _ := st.Info(ctx)
	t.Logf("filled %d events (%d bytes stored) in %s", info.State.Msgs, info.State.Bytes, time.Since(fill).Round(time.Millisecond))

	dir := filepath.Join(t.TempDir(), "backup")
	start := time.Now()
	m, err := backup.Backup(ctx, src.Conn, dir, backup.Options{Version: "scale"})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	var size int64
	for _, s := range m.Streams {
		for _, f := range s.Files {
			size += f.Size
		}
	}
	t.Logf("backup: %d streams, %d bytes on disk, %s", len(m.Streams), size, took.Round(time.Millisecond))

	start = time.Now()
	if _, err := backup.Verify(dir, "scale"); err != nil {
		t.Fatal(err)
	}
	t.Logf("verify alone: %s", time.Since(start).Round(time.Millisecond))

	dst := testkit.StartJetStream(t)
	start = time.Now()
	if _, err := backup.Restore(ctx, dst.Conn, dir, backup.RestoreOptions{Options: backup.Options{Version: "scale"}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("restore (verify included): %s", time.Since(start).Round(time.Millisecond))
	rs, _ := dst.JS.Stream(ctx, "FLEET_SCALE")
	if ri, _ := rs.Info(ctx); ri.State.Msgs != info.State.Msgs || ri.State.LastSeq != info.State.LastSeq {
		t.Fatalf("restored %d messages to %d, want %d to %d", ri.State.Msgs, ri.State.LastSeq, info.State.Msgs, info.State.LastSeq)
	}
}
