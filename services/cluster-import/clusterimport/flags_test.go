package clusterimport

import (
	"testing"

	"github.com/fleetstream/fleetstream/pkg/flagcheck/flagchecktest"
)

// TestValidate: every flag's bad value is refused with the flag named; good ones and the
// defaults pass.
func TestValidate(t *testing.T) {
	flagchecktest.Run(t, func() *Config { return new(Config) }, []flagchecktest.Case{
		{Args: nil, Want: ""},
		{Args: []string{"--unreachable-after=1m", "--policy-claim-grace=1m", "--credentials-allowed-proxies=proxy,10.0.0.1:3128"}, Want: ""},
		{Args: []string{"--unreachable-after=-1s"}, Want: "--unreachable-after -1s: must not be negative"},
		{Args: []string{"--policy-claim-grace=-1s"}, Want: "--policy-claim-grace -1s: must not be negative"},
		{Args: []string{"--max-agent-report-subjects-per-cluster=-1"}, Want: "--max-agent-report-subjects-per-cluster -1"},
		{Args: []string{"--max-agent-report-bytes-per-cluster=-1"}, Want: "--max-agent-report-bytes-per-cluster -1"},
		{Args: []string{"--credentials-allowed-proxies=http://proxy:3128"}, Want: `--credentials-allowed-proxies "http://proxy:3128": want a host or host:port`},
		{Args: []string{"--credentials-allowed-proxies=proxy:port"}, Want: `--credentials-allowed-proxies "proxy:port": port "port"`},
		// An entry with credentials is refused without quoting them back.
		{Args: []string{"--credentials-allowed-proxies=u:s3cret@proxy:3128"}, Want: `--credentials-allowed-proxies: an entry with credentials (user@host)`},
	})
}
