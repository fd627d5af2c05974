package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestParseTokenFile(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string
		wantErr string
	}{
		{name: "token and user", in: "s3cret,alice\n", want: "s3cret"},
		{name: "kube format with uid and groups", in: "s3cret,alice,1001,\"ops,dev\"\n", want: "s3cret"},
		{name: "token only", in: "s3cret", want: "s3cret"},
		{name: "comments and blanks first", in: "# tokens for fleetctl\n\n   \n  s3cret , alice\nother,bob\n", want: "s3cret"},
		{name: "crlf", in: "s3cret,alice\r\n", want: "s3cret"},
		{name: "empty file", in: "", wantErr: "no token"},
		{name: "only comments", in: "# nothing\n#more\n", wantErr: "no token"},
		{name: "empty token", in: ",alice\n", wantErr: "line 1: empty token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTokenFile([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("token = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestBearerTokenPrecedence(t *testing.T) {
	dir := t.TempDir()
	fileA := filepath.Join(dir, "a")
	fileB := filepath.Join(dir, "b")
	if err := os.WriteFile(fileA, []byte("from-flag-file,alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fileB, []byte("from-env-file,bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		want    string
		wantErr string
	}{
		{name: "nothing", want: ""},
		{name: "env token", env: map[string]string{envToken: "from-env"}, want: "from-env"},
		{name: "env token file", env: map[string]string{envTokenFile: fileB}, want: "from-env-file"},
		{name: "env token beats env file", env: map[string]string{envToken: "from-env", envTokenFile: fileB}, want: "from-env"},
		{name: "flag beats env", env: map[string]string{envToken: "from-env"}, args: []string{"--token", "from-flag"}, want: "from-flag"},
		{name: "flag file beats env token", env: map[string]string{envToken: "from-env"}, args: []string{"--token-file", fileA}, want: "from-flag-file"},
		{name: "both flags", args: []string{"--token", "x", "--token-file", fileA}, wantErr: "mutually exclusive"},
		{name: "missing file", args: []string{"--token-file", filepath.Join(dir, "missing")}, wantErr: "read token file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(envToken, "")
			t.Setenv(envTokenFile, "")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			f := &factory{}
			f.addFlags(&cobra.Command{Use: "fleetctl"})
			if err := f.root.PersistentFlags().Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := f.bearerToken()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("token = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestServerURL(t *testing.T) {
	tests := []struct {
		name    string
		env     string
		args    []string
		want    string
		wantErr string
	}{
		{name: "default", want: defaultServer},
		{name: "env", env: "https://fleet.example.com/", want: "https://fleet.example.com"},
		{name: "flag beats env", env: "https://fleet.example.com", args: []string{"--server", "http://localhost:9090"}, want: "http://localhost:9090"},
		{name: "no scheme", args: []string{"--server", "localhost:8080"}, wantErr: "want an http:// or https:// URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(envServer, tt.env)
			f := &factory{}
			f.addFlags(&cobra.Command{Use: "fleetctl"})
			if err := f.root.PersistentFlags().Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := f.serverURL()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("server = %q, want %q", got, tt.want)
			}
		})
	}
}
