package namespacebinding

import (
	"testing"

	"github.com/fleetstream/fleetstream/pkg/flagcheck/flagchecktest"
)

// TestValidate: every flag's bad value is refused with the flag named; good ones and the
// defaults pass.
func TestValidate(t *testing.T) {
	flagchecktest.Run(t, func() *Config { return new(Config) }, []flagchecktest.Case{
		{Args: nil, Want: ""},
		{Args: []string{"--claim-grace=30s", "--placement-score-refresh=1s", "--protected-namespaces=infra-*"}, Want: ""},
		{Args: []string{"--claim-grace=-1s"}, Want: "--claim-grace -1s: must not be negative"},
		{Args: []string{"--placement-score-refresh=-10s"}, Want: "--placement-score-refresh -10s: must not be negative"},
	})
}
