package namespacebinding

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
		{[]string{"--claim-grace=30s", "--placement-score-refresh=1s", "--protected-namespaces=infra-*"}, ""},
		{[]string{"--claim-grace=-1s"}, "--claim-grace -1s: must not be negative"},
		{[]string{"--placement-score-refresh=-10s"}, "--placement-score-refresh -10s: must not be negative"},
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
