package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

const e2eToken = "e2e-s3cret-token"

// e2eEnv is a real cluster-import ClusterService on an embedded JetStream, served by the same
// server scaffold (and bearer-token authentication) the production binary uses.
type e2eEnv struct {
	url       string
	tokenFile string
	// js is the hub's JetStream, for tests that play an agent.
	js *testkit.JetStream
}

func startClusterService(t *testing.T) *e2eEnv {
	t.Helper()
	ctx := testkit.Context(t, 2*time.Minute)
	js := testkit.StartJetStream(t)
	log := testkit.Logger(t)

	svc, err := clusterimport.New(ctx, js.JS, clusterimport.Config{PlaintextCredentials: true}, log)
	if err != nil {
		t.Fatalf("clusterimport.New: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("cluster-import Run: %v", err)
		}
	})
	select {
	case <-svc.Ready():
	case err := <-done:
		t.Fatalf("cluster-import stopped before ready: %v", err)
	case <-ctx.Done():
		t.Fatal("cluster-import not ready in time")
	}

	tokenFile := filepath.Join(t.TempDir(), "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte("# fleetctl e2e\n"+e2eToken+",alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{TokenFile: tokenFile}, log)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	testkit.Authorize(t, js.JS, srv, authz.Config{PlatformAdmins: []string{"alice"}})
	svc.Mount(srv)
	hs := httptest.NewServer(srv.Handler())
	// Registered after the service's cleanup so it runs first: open watches end before the
	// service stops.
	t.Cleanup(hs.Close)
	return &e2eEnv{url: hs.URL, tokenFile: tokenFile, js: js}
}

type result struct {
	code           int
	stdout, stderr string
}

// run executes fleetctl in-process against the test server with the right token file.
func (e *e2eEnv) run(t *testing.T, args ...string) result {
	t.Helper()
	return e.runWith(t, context.Background(), nil, append([]string{"--server", e.url, "--token-file", e.tokenFile}, args...)...)
}

func (e *e2eEnv) runWith(t *testing.T, ctx context.Context, stdin []byte, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Run(ctx, IOStreams{In: bytes.NewReader(stdin), Out: &out, ErrOut: &errOut}, args)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

func (r result) ok(t *testing.T) result {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	return r
}

func (r result) fails(t *testing.T, stderrPrefix string) {
	t.Helper()
	if r.code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, stderrPrefix) || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("stderr = %q, want one line starting %q", r.stderr, stderrPrefix)
	}
}

// jsonOf decodes -o json output.
func jsonOf[T any](t *testing.T, r result) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("decode %q: %v", r.stdout, err)
	}
	return v
}

// userTaints leaves out the fleetstream.io/ taints the registry manages itself: a cluster
// without a connected agent carries fleetstream.io/unreachable.
func (c clusterJSON) userTaints() []string {
	var out []string
	for _, t := range c.Taints {
		if !strings.HasPrefix(t.Key, "fleetstream.io/") {
			out = append(out, t.Key+":"+t.Effect)
		}
	}
	return out
}

type clusterJSON struct {
	ID     string            `json:"id"`
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
	Claims map[string]string `json:"claims"`
	Taints []struct {
		Key    string `json:"key"`
		Effect string `json:"effect"`
	} `json:"taints"`
	Status struct {
		CredentialsSet bool `json:"credentialsSet"`
	} `json:"status"`
}

const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster:
    server: https://10.0.0.1:6443
users:
- name: admin
  user:
    token: not-a-real-token
contexts:
- name: prod
  context:
    cluster: prod
    user: admin
current-context: prod
`

func TestEndToEnd(t *testing.T) {
	e := startClusterService(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(testKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}

	// Register with every flag; the table output carries the agent token once.
	r := e.run(t, "cluster", "register", "prod-eu-1", "--label", "env=prod", "--label", "tier=gold",
		"--claim", "region=eu-west-1", "--taint", "maintenance=true:NoSelectIfNew", "--kubeconfig", kubeconfig).ok(t)
	for _, want := range []string{"NAME", "prod-eu-1", "env=prod,tier=gold", "maintenance", "Agent token: ", "shown only this once"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("register output lacks %q:\n%s", want, r.stdout)
		}
	}

	// With -o json the token is part of the document and the warning goes to stderr.
	r = e.run(t, "-o", "json", "cluster", "register", "edge-1", "--label", "env=edge").ok(t)
	reg := jsonOf[struct {
		Cluster    clusterJSON `json:"cluster"`
		AgentToken string      `json:"agentToken"`
	}](t, r)
	if reg.Cluster.Name != "edge-1" || reg.Cluster.ID == "" || reg.AgentToken == "" {
		t.Errorf("register -o json = %+v", reg)
	}
	if !strings.Contains(r.stderr, "shown only this once") {
		t.Errorf("register -o json stderr = %q", r.stderr)
	}

	// List, sorted by name, with and without a selector.
	list := jsonOf[[]clusterJSON](t, e.run(t, "-o", "json", "cluster", "list").ok(t))
	if len(list) != 2 || list[0].Name != "edge-1" || list[1].Name != "prod-eu-1" {
		t.Fatalf("list = %+v", list)
	}
	r = e.run(t, "cluster", "list", "-l", "env=prod").ok(t)
	if !strings.Contains(r.stdout, "prod-eu-1") || strings.Contains(r.stdout, "edge-1") {
		t.Errorf("list -l env=prod:\n%s", r.stdout)
	}
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "NAME") {
		t.Errorf("list table:\n%s", r.stdout)
	}

	// Get shows what register stored, credentials only as a flag.
	got := jsonOf[clusterJSON](t, e.run(t, "-o", "json", "cluster", "get", "prod-eu-1").ok(t))
	if got.Labels["tier"] != "gold" || got.Claims["region"] != "eu-west-1" || strings.Join(got.userTaints(), ",") != "maintenance:TAINT_EFFECT_NO_SELECT_IF_NEW" || !got.Status.CredentialsSet {
		t.Errorf("get = %+v", got)
	}
	if strings.Contains(e.run(t, "-o", "yaml", "cluster", "get", "prod-eu-1").ok(t).stdout, "not-a-real-token") {
		t.Error("get printed the stored credentials")
	}
	r = e.run(t, "-o", "yaml", "cluster", "get", "prod-eu-1", "--inventory").ok(t)
	if !strings.Contains(r.stdout, "cluster:\n") || !strings.Contains(r.stdout, "name: prod-eu-1") {
		t.Errorf("get --inventory -o yaml:\n%s", r.stdout)
	}
	e.run(t, "cluster", "get", "prod-eu-1", "--inventory").ok(t)

	// Update replaces exactly the fields given: labels change, claims stay, taints clear.
	r = e.run(t, "-o", "json", "cluster", "update", "prod-eu-1", "--label", "env=staging", "--taint=").ok(t)
	upd := jsonOf[clusterJSON](t, r)
	if len(upd.Labels) != 1 || upd.Labels["env"] != "staging" || upd.Claims["region"] != "eu-west-1" || len(upd.userTaints()) != 0 {
		t.Errorf("update = %+v", upd)
	}

	// Server-side validation errors reach the user unchanged, naming the field.
	e.run(t, "cluster", "register", "bad", "--label", "bad key=x").fails(t, `error: invalid_argument: labels["bad key"]: key: `)
	e.run(t, "cluster", "register", "Not_A_DNS_Label").fails(t, `error: invalid_argument: name: "Not_A_DNS_Label": `)
	e.run(t, "cluster", "register", "prod-eu-1").fails(t, "error: already_exists: ")
	e.run(t, "cluster", "get", "nope").fails(t, "error: not_found: ")
	// Client-side flag errors never reach the server.
	e.run(t, "cluster", "register", "x", "--taint", "a=b").fails(t, `error: --taint "a=b": want key=value:Effect`)
	e.run(t, "-o", "xml", "cluster", "list").fails(t, `error: --output "xml"`)

	// Deregister, then the cluster is gone.
	r = e.run(t, "cluster", "deregister", "edge-1").ok(t)
	if !strings.Contains(r.stdout, `cluster "edge-1" deregistered`) {
		t.Errorf("deregister output %q", r.stdout)
	}
	e.run(t, "cluster", "get", "edge-1").fails(t, "error: not_found: ")
}

func TestEndToEndAuthentication(t *testing.T) {
	e := startClusterService(t)
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{name: "no token", args: []string{"--server", e.url}, want: "error: unauthenticated: missing or invalid bearer token\n"},
		{name: "wrong token", args: []string{"--server", e.url, "--token", "wrong-" + e2eToken}, want: "error: unauthenticated: missing or invalid bearer token\n"},
		{name: "token flag", args: []string{"--server", e.url, "--token", e2eToken}},
		{name: "environment", env: map[string]string{envServer: e.url, envToken: e2eToken}},
		{name: "token file from environment", env: map[string]string{envServer: e.url, envTokenFile: e.tokenFile}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{envServer, envToken, envTokenFile} {
				t.Setenv(k, tt.env[k])
			}
			r := e.runWith(t, context.Background(), nil, append(tt.args, "cluster", "list")...)
			if tt.want == "" {
				r.ok(t)
				return
			}
			if r.code != 1 || r.stderr != tt.want {
				t.Fatalf("exit %d, stderr %q; want 1, %q", r.code, r.stderr, tt.want)
			}
			if strings.Contains(r.stdout+r.stderr, e2eToken) {
				t.Fatal("output contains the token")
			}
		})
	}
}

// syncBuffer lets the test read a watch's output while the watch writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestEndToEndWatch(t *testing.T) {
	e := startClusterService(t)
	e.run(t, "cluster", "register", "a", "--label", "env=prod").ok(t)
	e.run(t, "cluster", "register", "b", "--label", "env=dev").ok(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
			[]string{"--server", e.url, "--token-file", e.tokenFile, "-o", "json", "cluster", "watch", "-l", "env=prod"})
	}()

	type event struct {
		Type    string      `json:"type"`
		Cluster clusterJSON `json:"cluster"`
	}
	events := func() []event {
		var evs []event
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if line == "" {
				continue
			}
			var ev event
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("watch line %q: %v", line, err)
			}
			evs = append(evs, ev)
		}
		return evs
	}
	waitFor := func(n int) []event {
		t.Helper()
		var evs []event
		testkit.Eventually(t, 20*time.Second, func() error {
			if evs = events(); len(evs) < n {
				return fmt.Errorf("watch printed %d events, want %d; stdout:\n%s\nstderr:\n%s", len(evs), n, out.String(), errOut.String())
			}
			return nil
		})
		return evs
	}

	// The snapshot holds only the selected cluster.
	evs := waitFor(1)
	if evs[0].Type != "EVENT_TYPE_ADDED" || evs[0].Cluster.Name != "a" {
		t.Fatalf("first event %+v", evs[0])
	}
	// A cluster appearing under the selector, and one leaving it.
	e.run(t, "cluster", "register", "c", "--label", "env=prod").ok(t)
	e.run(t, "cluster", "deregister", "a").ok(t)
	evs = waitFor(3)
	if evs[1].Type != "EVENT_TYPE_ADDED" || evs[1].Cluster.Name != "c" || evs[2].Type != "EVENT_TYPE_DELETED" {
		t.Fatalf("events %+v", evs)
	}
	for _, ev := range evs {
		if ev.Cluster.Name == "b" {
			t.Fatalf("watch -l env=prod showed b: %+v", evs)
		}
	}

	// Interrupting ends the watch successfully.
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("watch exit %d, stderr %q", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end after cancel")
	}
}
