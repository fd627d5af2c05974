package collector

import (
	"flag"
	"strings"
	"testing"
)

// TestValidate: every flag's bad value is refused with the flag named; good ones and the
// defaults pass.
func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the error; "" for none
	}{
		{nil, ""},
		{[]string{"--stale-after=10s", "--evict-after=1m", "--response-cache-bytes=-1", "--workers=4"}, ""},
		{[]string{"--stale-after=10m"}, ""}, // the default --evict-after rises to it, as before
		{[]string{"--stale-after=-1s"}, "--stale-after -1s: must not be negative"},
		{[]string{"--evict-after=-1s"}, "--evict-after -1s"},
		{[]string{"--stale-after=1m", "--evict-after=30s"}, "--evict-after must not be shorter than --stale-after"},
		{[]string{"--weight-cleanup-after=-1h"}, "--weight-cleanup-after -1h0m0s"},
		{[]string{"--view-flush-interval=-1ms"}, "--view-flush-interval -1ms"},
		{[]string{"--workers=-1"}, "--workers -1"},
		{[]string{"--response-cache-bytes=-2"}, "--response-cache-bytes: want -1"},
		{[]string{"--max-endpoint-slices-per-cluster=-1"}, "--max-endpoint-slices-per-cluster -1"},
		{[]string{"--max-endpoints-per-cluster=-1"}, "--max-endpoints-per-cluster -1"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var c Config
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			c.RegisterFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
