package clusterimport

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
		{[]string{"--unreachable-after=1m", "--policy-claim-grace=1m", "--credentials-allowed-proxies=proxy,10.0.0.1:3128"}, ""},
		{[]string{"--unreachable-after=-1s"}, "--unreachable-after -1s: must not be negative"},
		{[]string{"--policy-claim-grace=-1s"}, "--policy-claim-grace -1s: must not be negative"},
		{[]string{"--max-agent-report-subjects-per-cluster=-1"}, "--max-agent-report-subjects-per-cluster -1"},
		{[]string{"--max-agent-report-bytes-per-cluster=-1"}, "--max-agent-report-bytes-per-cluster -1"},
		{[]string{"--credentials-allowed-proxies=http://proxy:3128"}, `--credentials-allowed-proxies "http://proxy:3128": want a host or host:port`},
		{[]string{"--credentials-allowed-proxies=proxy:port"}, `--credentials-allowed-proxies "proxy:port": port "port"`},
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
