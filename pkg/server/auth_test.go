package server

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestLoadTokens(t *testing.T) {
	cases := []struct {
		name, file string
		token      string
		want       Identity
		wantErr    string
	}{
		{name: "user only", file: "t1,alice\n", token: "t1", want: Identity{User: "alice"}},
		{name: "kube format with groups", file: "# comment\n\nt2,bob,uid-2,\"ops,dev\"\n", token: "t2", want: Identity{User: "bob", Groups: []string{"ops", "dev"}}},
		{name: "uid without groups", file: "t3,carol,uid-3\n", token: "t3", want: Identity{User: "carol"}},
		{name: "missing user", file: "secret-token\n", wantErr: "line 1"},
		{name: "empty", file: "# nothing\n", wantErr: "no tokens"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "tokens")
			if err := os.WriteFile(p, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			toks, err := LoadTokens(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want error with %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "secret-token") {
					t.Fatal("error quotes the secret")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			id, ok := toks.Lookup(tc.token)
			if !ok || id.User != tc.want.User || !slices.Equal(id.Groups, tc.want.Groups) {
				t.Fatalf("lookup: %+v %v, want %+v", id, ok, tc.want)
			}
			if _, ok := toks.Lookup(tc.token + "x"); ok {
				t.Fatal("wrong token accepted")
			}
		})
	}
}
