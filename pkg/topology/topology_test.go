package topology_test

import (
	"flag"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

func TestParseRetention(t *testing.T) {
	cases := []struct {
		spec    string
		want    topology.Retention
		wantErr bool
	}{
		{"max-age=720h", topology.Retention{MaxAge: 720 * time.Hour}, false},
		{"max-age=90d,max-bytes=10GiB", topology.Retention{MaxAge: 90 * 24 * time.Hour, MaxBytes: 10 << 30}, false},
		{"max-bytes=512MiB", topology.Retention{MaxBytes: 512 << 20}, false},
		{"max-bytes=1000", topology.Retention{MaxBytes: 1000}, false},
		{"max-age=forever,max-bytes=unlimited", topology.Forever, false},
		{"max-age=0,max-bytes=0", topology.Forever, false},
		{"max-age=-1h", topology.Retention{}, true},
		{"max-age=soon", topology.Retention{}, true},
		{"max-bytes=10GB", topology.Retention{}, true},
		{"max-bytes=-5", topology.Retention{}, true},
		{"max-msgs=5", topology.Retention{}, true},
		{"720h", topology.Retention{}, true},
		{"max-age=1m", topology.Retention{}, true}, // below the duplicate window: JetStream would refuse the stream
		{"max-age=2m", topology.Retention{MaxAge: 2 * time.Minute}, false},
		{"max-age=0d", topology.Forever, false},
		{"max-age=100000d", topology.Retention{MaxAge: 100_000 * 24 * time.Hour}, false},
		{"max-age=4000000000d", topology.Retention{}, true}, // would overflow time.Duration
	}
	for _, tc := range cases {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := topology.ParseRetention(tc.spec)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err == nil && got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if err == nil {
				again, err := topology.ParseRetention(got.String())
				if err != nil || again != got {
					t.Fatalf("%q does not parse back: %+v, %v", got.String(), again, err)
				}
			}
		})
	}
}

func TestRetentionsFlagAndEnsure(t *testing.T) {
	rs := topology.Retentions{}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.Var(rs, "stream-retention", "")
	if err := fs.Parse([]string{"--stream-retention", "EV=max-age=1h,max-bytes=1MiB", "--stream-retention", "OTHER=max-age=2d"}); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--stream-retention", "EV"}); err == nil {
		t.Fatal("a retention without limits was accepted")
	}
	base := topology.Topology{Streams: []jetstream.StreamConfig{
		topology.EventStream("EV", "events", "ev.>"),
		topology.EventStream("KEPT", "kept", "kept.>"),
	}}
	if got := topology.Of(base.Streams[0]); got != topology.Forever {
		t.Fatalf("event streams default to %v, want forever", got)
	}
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 10*time.Second)
	check := func(name string, want topology.Retention) {
		t.Helper()
		s, err := j.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := topology.Of(info.Config); got != want {
			t.Fatalf("%s: server keeps %v, want %v", name, got, want)
		}
	}
	// First start with the defaults, then restart with the override: the existing stream's limits
	// change; then back.
	if err := topology.Ensure(ctx, j.JS, 1, base); err != nil {
		t.Fatal(err)
	}
	check("EV", topology.Forever)
	if err := topology.Ensure(ctx, j.JS, 1, rs.Apply(base)); err != nil {
		t.Fatal(err)
	}
	check("EV", topology.Retention{MaxAge: time.Hour, MaxBytes: 1 << 20})
	check("KEPT", topology.Forever)
	if base.Streams[0].MaxAge != 0 {
		t.Fatal("Apply changed its argument")
	}
	if err := topology.Ensure(ctx, j.JS, 1, base); err != nil {
		t.Fatal(err)
	}
	check("EV", topology.Forever)
}

// TestOpenBucketUpdatesOnlyWhatDiffers: opening a bucket that already has the configuration asks
// the meta leader nothing (no stream create or update request), while a changed field is applied.
func TestOpenBucketUpdatesOnlyWhatDiffers(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 10*time.Second)
	var mu sync.Mutex
	var writes []string
	sub, err := j.Conn.Subscribe("$JS.API.STREAM.*.KV_views", func(m *nats.Msg) {
		mu.Lock()
		writes = append(writes, m.Subject)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	writesSince := func(n int) []string {
		t.Helper()
		if err := j.Conn.Flush(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, s := range writes[n:] {
			if strings.Contains(s, ".CREATE.") || strings.Contains(s, ".UPDATE.") {
				out = append(out, s)
			}
		}
		return out
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(writes) }

	cfg := jetstream.KeyValueConfig{Bucket: "views", Description: "a view", Storage: jetstream.FileStorage,
		TTL: time.Hour, Metadata: map[string]string{"owner": "test"}}
	cases := []struct {
		name        string
		change      func(c *jetstream.KeyValueConfig)
		wantCreated bool
		wantWrite   bool
	}{
		{"absent: created", func(*jetstream.KeyValueConfig) {}, true, true},
		{"same: looked up only", func(*jetstream.KeyValueConfig) {}, false, false},
		{"defaults spelled out: looked up only", func(c *jetstream.KeyValueConfig) { c.History, c.Replicas, c.MaxBytes = 1, 1, -1 }, false, false},
		{"description changed: updated", func(c *jetstream.KeyValueConfig) { c.Description = "the view" }, false, true},
		{"history changed: updated", func(c *jetstream.KeyValueConfig) { c.Description, c.History = "the view", 5 }, false, true},
		{"metadata changed: updated", func(c *jetstream.KeyValueConfig) {
			c.Description, c.History, c.Metadata = "the view", 5, map[string]string{"owner": "other"}
		}, false, true},
		{"after the update: looked up only", func(c *jetstream.KeyValueConfig) {
			c.Description, c.History, c.Metadata = "the view", 5, map[string]string{"owner": "other"}
		}, false, false},
	}
	for _, tc := range cases {
		c := cfg
		tc.change(&c)
		before := count()
		kv, created, err := topology.OpenBucket(ctx, j.JS, c)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if created != tc.wantCreated {
			t.Errorf("%s: created %v, want %v", tc.name, created, tc.wantCreated)
		}
		if got := writesSince(before); (len(got) > 0) != tc.wantWrite {
			t.Errorf("%s: stream writes %v, want any: %v", tc.name, got, tc.wantWrite)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if have := st.Config(); have.Description != c.Description || have.History != max(c.History, 1) || have.Metadata["owner"] != c.Metadata["owner"] {
			t.Errorf("%s: bucket has %q, history %d, owner %q; want %q, %d, %q", tc.name, have.Description, have.History,
				have.Metadata["owner"], c.Description, max(c.History, 1), c.Metadata["owner"])
		}
	}
}
