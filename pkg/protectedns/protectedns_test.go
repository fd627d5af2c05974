package protectedns

import (
	"flag"
	"slices"
	"testing"
)

func TestMatch(t *testing.T) {
	l, err := New("infra-*", "monitoring")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns      string
		pattern string
	}{
		{"kube-system", "kube-*"},
		{"kube-public", "kube-*"},
		{"kube-node-lease", "kube-*"},
		{"default", "default"},
		{"fleetstream", "fleetstream"},
		{"fleetstream-agent", "fleetstream-agent"},
		{"infra-logging", "infra-*"},
		{"monitoring", "monitoring"},
		{"web", ""},
		{"kube", ""}, // the prefix is "kube-"
		{"defaults", ""},
		{"fleetstream-agents", ""},
		{"monitoring-2", ""},
	} {
		p, ok := l.Match(tc.ns)
		if p != tc.pattern || ok != (tc.pattern != "") {
			t.Errorf("Match(%q) = %q, %v; want %q", tc.ns, p, ok, tc.pattern)
		}
	}
}

// The defaults cannot be configured away: the zero List and a List with other patterns still
// protect them.
func TestDefaultsAlwaysApply(t *testing.T) {
	var zero List
	for _, ns := range []string{"kube-system", "default", "fleetstream-agent"} {
		if _, ok := zero.Match(ns); !ok {
			t.Errorf("zero List: %s not protected", ns)
		}
	}
	var l List
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	l.RegisterFlags(fs)
	if err := fs.Parse([]string{"--protected-namespaces=a,b-*", "--protected-namespaces", "c,kube-*"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"kube-*", "default", "fleetstream", "fleetstream-agent", "a", "b-*", "c"}
	if got := l.Patterns(); !slices.Equal(got, want) {
		t.Errorf("Patterns() = %v, want %v", got, want)
	}
	if got := l.Reason("kube-system"); got != `"kube-system" is protected (kube-*)` {
		t.Errorf("Reason = %q", got)
	}
	if got := l.Reason("web"); got != "" {
		t.Errorf("Reason(web) = %q", got)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		ok      bool
	}{
		{"web", true},
		{"team-*", true},
		{"t*", true},
		{"*", false},
		{"a*b", false},
		{"a**", false},
		{"Web", false},
		{"we_b", false},
		{"-web", false},
	} {
		if err := Validate(tc.pattern); (err == nil) != tc.ok {
			t.Errorf("Validate(%q) = %v, want ok=%v", tc.pattern, err, tc.ok)
		}
	}
	if _, err := New("web", "Bad"); err == nil {
		t.Error("New accepted an invalid pattern")
	}
}
