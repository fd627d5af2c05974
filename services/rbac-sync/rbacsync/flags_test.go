package rbacsync

import (
	"testing"

	"github.com/fleetstream/fleetstream/pkg/flagcheck/flagchecktest"
)

// TestValidate: every flag's bad value is refused with the flag named; good ones and the
// defaults pass.
func TestValidate(t *testing.T) {
	flagchecktest.Run(t, func() *Config { return new(Config) }, []flagchecktest.Case{
		{Args: nil, Want: ""},
		{Args: []string{"--access-snapshot-every=10", "--access-snapshot-max-age=5m", "--access-snapshots-kept=2"}, Want: ""},
		{Args: []string{"--access-snapshot-max-age=-1m"}, Want: "--access-snapshot-max-age -1m0s: must not be negative"},
		{Args: []string{"--access-snapshots-kept=-1"}, Want: "--access-snapshots-kept -1: must not be negative"},
	})
}
