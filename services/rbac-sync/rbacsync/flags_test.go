package rbacsync

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
		{[]string{"--access-snapshot-every=10", "--access-snapshot-max-age=5m", "--access-snapshots-kept=2"}, ""},
		{[]string{"--access-snapshot-max-age=-1m"}, "--access-snapshot-max-age -1m0s: must not be negative"},
		{[]string{"--access-snapshots-kept=-1"}, "--access-snapshots-kept -1: must not be negative"},
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
