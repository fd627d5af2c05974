package collector

import (
	"testing"

	"github.com/fleetstream/fleetstream/pkg/flagcheck/flagchecktest"
)

// TestValidate: every flag's bad value is refused with the flag named; good ones and the
// defaults pass.
func TestValidate(t *testing.T) {
	flagchecktest.Run(t, func() *Config { return new(Config) }, []flagchecktest.Case{
		{Args: nil, Want: ""},
		{Args: []string{"--stale-after=10s", "--evict-after=1m", "--response-cache-bytes=-1", "--workers=4"}, Want: ""},
		{Args: []string{"--stale-after=10m"}, Want: ""}, // the default --evict-after rises to it, as before
		{Args: []string{"--stale-after=-1s"}, Want: "--stale-after -1s: must not be negative"},
		{Args: []string{"--evict-after=-1s"}, Want: "--evict-after -1s"},
		{Args: []string{"--stale-after=1m", "--evict-after=30s"}, Want: "--evict-after must not be shorter than --stale-after"},
		{Args: []string{"--weight-cleanup-after=-1h"}, Want: "--weight-cleanup-after -1h0m0s"},
		{Args: []string{"--view-flush-interval=-1ms"}, Want: "--view-flush-interval -1ms"},
		{Args: []string{"--workers=-1"}, Want: "--workers -1"},
		{Args: []string{"--response-cache-bytes=-2"}, Want: "--response-cache-bytes: want -1"},
		{Args: []string{"--max-endpoint-slices-per-cluster=-1"}, Want: "--max-endpoint-slices-per-cluster -1"},
		{Args: []string{"--max-endpoints-per-cluster=-1"}, Want: "--max-endpoints-per-cluster -1"},
	})
}
