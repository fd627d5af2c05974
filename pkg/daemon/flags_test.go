package daemon

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// grace is a service's Flags in miniature.
type grace struct{ d time.Duration }

func (g *grace) RegisterFlags(fs *flag.FlagSet) { fs.DurationVar(&g.d, "grace", time.Minute, "") }
func (g *grace) Validate() error {
	if g.d < 0 {
		return errors.New("--grace: must not be negative")
	}
	return nil
}

// TestParse: a bad value of a shared flag or of the service's stops the binary with exit code
// 2 and the flag named; -help exits 0; good flags go on.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		ok   bool
		want string // in the output
	}{
		{[]string{"--grace=2m", "--replicas=3"}, 0, true, ""},
		{[]string{"-help"}, 0, false, "-grace"},
		{[]string{"--no-such-flag"}, 2, false, "flag provided but not defined"},
		{[]string{"--grace=-1s"}, 2, false, "svc: --grace: must not be negative"},
		{[]string{"--nats-url=http://nats:4222"}, 2, false, `--nats-url "http://nats:4222": scheme "http"`},
		{[]string{"--listen=8080"}, 2, false, `--listen "8080": want host:port`},
		{[]string{"--replicas=7"}, 2, false, "--replicas 7: want 1 to 5"},
		{[]string{"--replicas=-1"}, 2, false, "--replicas -1"},
		{[]string{"--max-request-bytes=-1"}, 2, false, "--max-request-bytes -1"},
		{[]string{"--oidc-client-id=x"}, 2, false, "--oidc-client-id needs --oidc-issuer-url"},
		{[]string{"--oidc-issuer-url=http://idp", "--oidc-client-id=x"}, 2, false, "want an https:// URL"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("svc", flag.ContinueOnError)
			var out strings.Builder
			fs.SetOutput(&out)
			var o Options
			code, ok := Parse(fs, tc.args, &o, &grace{})
			if code != tc.code || ok != tc.ok || !strings.Contains(out.String(), tc.want) {
				t.Fatalf("Parse = %d, %v, output %q; want %d, %v, output with %q", code, ok, out.String(), tc.code, tc.ok, tc.want)
			}
		})
	}
}

// TestParseDefaults: the shared flags' defaults pass their own checks.
func TestParseDefaults(t *testing.T) {
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o Options
	if _, ok := Parse(fs, nil, &o, &grace{}); !ok {
		t.Fatal("the defaults do not pass")
	}
}
