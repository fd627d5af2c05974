package keys

import (
	"regexp"
	"testing"
)

var validToken = regexp.MustCompile(`^[-_=A-Za-z0-9]+$`)

func TestRoundTrip(t *testing.T) {
	for _, s := range []string{
		"", "web", "kube-system", "system:aggregate-to-admin", "app.example.com", "a=b", "=", "==",
		"with/slash", "ünïcode", "*", ">", "a b", "_kv",
	} {
		enc := Encode(s)
		if !validToken.MatchString(enc) {
			t.Errorf("Encode(%q) = %q: not a valid single token", s, enc)
		}
		dec, err := Decode(enc)
		if err != nil || dec != s {
			t.Errorf("Decode(Encode(%q)) = %q, %v", s, dec, err)
		}
	}
}

func TestDistinctInputsDistinctTokens(t *testing.T) {
	if Encode("a.b") == Encode("a_b") || Encode("a:b") == Encode("a.b") {
		t.Fatal("collision")
	}
}

func TestJoinSplit(t *testing.T) {
	parts := []string{"c1", "ClusterRole", "", "system:controller:x.y"}
	got, err := Split(Join(parts...))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(parts) {
		t.Fatalf("got %q", got)
	}
	for i := range parts {
		if got[i] != parts[i] {
			t.Fatalf("part %d: got %q want %q", i, got[i], parts[i])
		}
	}
}

func TestDecodeRejectsGarbage(t *testing.T) {
	for _, s := range []string{"=", "=4", "=ZZ", "a.b", "a*"} {
		if s == "=" {
			continue // the empty string's encoding
		}
		if _, err := Decode(s); err == nil {
			t.Errorf("Decode(%q) accepted", s)
		}
	}
}

func FuzzRoundTrip(f *testing.F) {
	f.Add("system:masters")
	f.Fuzz(func(t *testing.T, s string) {
		enc := Encode(s)
		if !validToken.MatchString(enc) {
			t.Fatalf("invalid token %q", enc)
		}
		if dec, err := Decode(enc); err != nil || dec != s {
			t.Fatalf("round trip %q -> %q -> %q, %v", s, enc, dec, err)
		}
	})
}
