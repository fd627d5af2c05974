// Package flagchecktest runs the table tests of a service's flags: the args of each case parsed
// into fresh options, then their Validate, whose error must name what the case expects.
package flagchecktest

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/flagcheck"
)

// Case is one command line and what Validate must say of it.
type Case struct {
	Args []string
	// Want is in the error ("" for no error).
	Want string
}

// Run runs every case on options from newFlags.
func Run[F flagcheck.Flags](t *testing.T, newFlags func() F, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(strings.Join(tc.Args, " "), func(t *testing.T) {
			f := newFlags()
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f.RegisterFlags(fs)
			if err := fs.Parse(tc.Args); err != nil {
				t.Fatal(err)
			}
			err := f.Validate()
			switch {
			case tc.Want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.Want != "" && (err == nil || !strings.Contains(err.Error(), tc.Want)):
				t.Fatalf("Validate = %v, want an error with %q", err, tc.Want)
			}
		})
	}
}
