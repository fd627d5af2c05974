package cli

import (
	"encoding/pem"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain points the configuration file at a temporary one, so that no test reads or writes
// the developer's own contexts.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fleetctl-config")
	if err != nil {
		panic(err)
	}
	os.Setenv(envConfig, filepath.Join(dir, "config.yaml"))
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestContexts drives a real registry through contexts: the current one, --context, the
// environment overriding the context, and the file kept private.
func TestContexts(t *testing.T) {
	e := startClusterService(t)
	cfg := filepath.Join(t.TempDir(), "fleet", "config.yaml")
	t.Setenv(envConfig, cfg)
	run := func(args ...string) result {
		t.Helper()
		return e.runWith(t, t.Context(), nil, args...)
	}
	// Without a context fleetctl goes to the default server, where nothing listens.
	run("config", "set-context", "test", "--context-server", e.url, "--context-token-file", e.tokenFile).ok(t)
	run("config", "set-context", "elsewhere", "--context-server", "http://127.0.0.1:1", "--use").ok(t)
	info, err := os.Stat(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("configuration file mode %v, want 0600", info.Mode().Perm())
	}

	if r := run("cluster", "list"); r.code != 1 || !strings.Contains(r.stderr, "127.0.0.1:1") {
		t.Fatalf("the current context was not used: exit %d, %s", r.code, r.stderr)
	}
	run("--context", "test", "cluster", "register", "eu-1").ok(t)
	run("config", "use-context", "test").ok(t)
	if r := run("cluster", "list").ok(t); !strings.Contains(r.stdout, "eu-1") {
		t.Fatalf("cluster list through the current context:\n%s", r.stdout)
	}
	// The environment still overrides the context, and the context's token does not follow
	// the server elsewhere: the registry refuses the unauthenticated call.
	t.Setenv(envServer, e.url)
	t.Setenv(envTokenFile, "")
	run("config", "set-context", "test", "--context-server", "http://127.0.0.1:1").ok(t)
	if r := run("cluster", "list"); r.code != 1 || !strings.Contains(r.stderr, "unauthenticated") {
		t.Fatalf("with %s set: exit %d\n%s%s", envServer, r.code, r.stdout, r.stderr)
	}
	if r := run("--context", "nope", "cluster", "list"); r.code != 1 || !strings.Contains(r.stderr, `context "nope" is not in`) {
		t.Fatalf("unknown --context: exit %d\n%s", r.code, r.stderr)
	}
	if r := run("config", "get-contexts").ok(t); strings.Contains(r.stdout, "e2e-s3cret") || !strings.Contains(r.stdout, "*         test") {
		t.Errorf("get-contexts:\n%s", r.stdout)
	}
	// A context with credentials and no server does not send them to the default server.
	t.Setenv(envServer, "")
	run("config", "set-context", "serverless", "--context-token-file", e.tokenFile).ok(t)
	if r := run("--context", "serverless", "cluster", "list"); r.code != 1 || !strings.Contains(r.stderr, `context "serverless" has credentials but no server`) {
		t.Fatalf("a context without a server: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestContextCertificateAuthority: a context's CA lets fleetctl reach a server whose certificate
// the system does not trust; without it the call fails on the certificate.
func TestContextCertificateAuthority(t *testing.T) {
	e := startClusterService(t)
	target, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	tlsSrv := httptest.NewTLSServer(httputil.NewSingleHostReverseProxy(target))
	t.Cleanup(tlsSrv.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envConfig, filepath.Join(dir, "config.yaml"))
	run := func(args ...string) result {
		t.Helper()
		return e.runWith(t, t.Context(), nil, args...)
	}
	run("config", "set-context", "tls", "--context-server", tlsSrv.URL, "--context-token-file", e.tokenFile, "--use").ok(t)
	if r := run("cluster", "list"); r.code != 1 || !strings.Contains(r.stderr, "certificate") {
		t.Fatalf("without the CA: exit %d\n%s", r.code, r.stderr)
	}
	run("config", "set-context", "tls", "--certificate-authority", ca).ok(t)
	run("cluster", "register", "eu-1").ok(t)
	if r := run("cluster", "list").ok(t); !strings.Contains(r.stdout, "eu-1") {
		t.Fatalf("cluster list over TLS:\n%s", r.stdout)
	}
}
