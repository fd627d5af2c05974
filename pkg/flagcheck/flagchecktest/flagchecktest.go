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

// SharedFlags checks that every flag binary registers is registered by one of shared too (the
// daemon's and the service's own RegisterFlags, which fleetd composes), or is listed in
// binaryOnly with why fleetd has no use for it; and that binaryOnly lists only flags the
// binary has. A flag the binary registers on its own fails: fleetd would not get it
// (services/fleetd/cmd/fleetd's TestFlagsOfEveryService checks fleetd has shared's).
func SharedFlags(t *testing.T, binary func(*flag.FlagSet), shared []func(*flag.FlagSet), binaryOnly map[string]string) {
	t.Helper()
	bin := flag.NewFlagSet("binary", flag.ContinueOnError)
	binary(bin)
	common := flag.NewFlagSet("shared", flag.ContinueOnError)
	for _, register := range shared {
		register(common)
	}
	bin.VisitAll(func(f *flag.Flag) {
		if common.Lookup(f.Name) == nil && binaryOnly[f.Name] == "" {
			t.Errorf("--%s is registered by the binary alone: fleetd does not get it (register it in the service's RegisterFlags, or list it in binaryOnly with why fleetd has no use for it)", f.Name)
		}
	})
	for name := range binaryOnly {
		if bin.Lookup(name) == nil {
			t.Errorf("binaryOnly lists --%s, which the binary no longer has", name)
		}
	}
}
