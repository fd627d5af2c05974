package topology_test

import (
	"flag"
	"testing"
	"time"

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
