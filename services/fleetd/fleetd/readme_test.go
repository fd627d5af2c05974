package fleetd_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// The README's commands are read from README.md when the test runs, so an edited README is
// tested as edited. Each command runs through `bash -c` in a directory laid out like a checkout
// after `make run`: bin/fleetctl (built from this tree) and .data/tokens (dev-admin's token, a
// platform admin, as `make run` creates it), against a fresh in-process fleetd that `make run`
// would have started with that token file.
//
// What the test changes in the commands, and why:
//   - http://127.0.0.1:8080 (make run's address) is the test fleetd's address, and
//     FLEETSTREAM_SERVER points there, as `make run` tells a user to export;
//   - `fleetctl events tail` and `fleetctl admin` get --nats-url, since their default is make
//     run's NATS port;
//   - curl gets --fail-with-body, so an HTTP error fails the command (curl exits 0 on a 401), and
//     the commands run in bash with pipefail, so a curl piped into sed fails too;
//   - a command the README says runs until interrupted (events tail) runs until it printed an
//     event, then gets SIGINT, as a user's Ctrl-C, and must exit 0.
//
// Out of scope: the block that runs bin/cluster-agent against ~/.kube/config needs a real
// member cluster (the agent's behaviour is tested against real kube-apiservers elsewhere in
// this package); the test skips exactly the blocks that call bin/cluster-agent and fails if there
// is none, so a change of the README's structure is noticed.

const readmePath = "../../../README.md"

// readmeSection is one `## ` section of the README whose ```sh blocks the test runs, in order,
// against one fresh fleetd.
type readmeSection struct {
	heading string
	// skip names a substring of the blocks left out, and why; each must match a block.
	skip map[string]string
	// before runs before the first block containing its key, for what the README leaves to the
	// user (files made by commands against real clusters); each must match a block.
	before map[string]func(t *testing.T, w *tourDir)
}

func TestReadmeCommandsRunAsWritten(t *testing.T) {
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	fleetctl := buildFleetctl(t)
	sections := []readmeSection{
		// Optional in the issue, cheap to run: the token, fleetctl and curl examples.
		{heading: "## Run it: `make run`"},
		{
			heading: "## A tour with fleetctl",
			skip: map[string]string{
				"bin/cluster-agent": "needs a real member cluster (~/.kube/config)",
			},
			before: map[string]func(t *testing.T, w *tourDir){
				"bin/fleetctl import ": importFiles,
			},
		},
		{
			heading: "## Fleet as code",
			before: map[string]func(t *testing.T, w *tourDir){
				"examples/gitops": gitopsExample,
			},
		},
	}
	for _, sec := range sections {
		t.Run(strings.TrimLeft(sec.heading, "# "), func(t *testing.T) {
			blocks := shBlocks(t, readme, sec.heading)
			w := newTourDir(t, fleetctl)
			used := map[string]bool{}
			ran := 0
			for _, b := range blocks {
				if key, why := matchAny(b.text, sec.skip); key != "" {
					used[key] = true
					t.Logf("README.md:%d: block skipped: %s", b.line, why)
					continue
				}
				for key, fn := range sec.before {
					if strings.Contains(b.text, key) && !used[key] {
						used[key] = true
						fn(t, w)
					}
				}
				for _, c := range splitCommands(b) {
					w.run(t, c)
					ran++
				}
			}
			for key := range sec.skip {
				if !used[key] {
					t.Errorf("no block of %q contains %q: the README changed; update this test", sec.heading, key)
				}
			}
			for key := range sec.before {
				if !used[key] {
					t.Errorf("no block of %q contains %q: the README changed; update this test", sec.heading, key)
				}
			}
			if ran == 0 {
				t.Fatalf("no command of %q ran", sec.heading)
			}
			t.Logf("%d commands of %q ran", ran, sec.heading)
		})
	}
}

func matchAny(text string, m map[string]string) (string, string) {
	for key, why := range m {
		if strings.Contains(text, key) {
			return key, why
		}
	}
	return "", ""
}

// buildFleetctl builds fleetctl from this tree once for all sections.
func buildFleetctl(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fleetctl")
	ctx := testkit.Context(t, 10*time.Minute)
	cmd := exec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-o", bin, ".")
	cmd.Dir = "../../fleetctl"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build fleetctl: %v\n%s", err, out)
	}
	return bin
}

type shBlock struct {
	line int // of the first line inside the fence
	text string
}

// shBlocks returns the ```sh blocks of the README section under heading (a `## ` line, up to
// the next `## ` or `# ` line; its `###` subsections included). A missing heading or a section
// without such blocks fails the test: the test must not pass by running nothing.
func shBlocks(t *testing.T, readme []byte, heading string) []shBlock {
	t.Helper()
	var (
		blocks          []shBlock
		in, inFence, sh bool
		cur             []string
		start           int
		found           bool
	)
	sc := bufio.NewScanner(bytes.NewReader(readme))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if !inFence && (strings.HasPrefix(line, "## ") || strings.HasPrefix(line, "# ")) {
			in = line == heading
			found = found || in
			continue
		}
		if strings.HasPrefix(line, "```") {
			if inFence {
				if in && sh {
					blocks = append(blocks, shBlock{line: start, text: strings.Join(cur, "\n")})
				}
				inFence, cur = false, nil
				continue
			}
			inFence, sh, start = true, strings.TrimSpace(line) == "```sh", n+1
			continue
		}
		if inFence {
			cur = append(cur, line)
		}
	}
	if !found {
		t.Fatalf("README.md has no heading %q", heading)
	}
	if len(blocks) == 0 {
		t.Fatalf("README.md section %q has no ```sh block", heading)
	}
	return blocks
}

type shCommand struct {
	line int // in README.md; 0 for a command the test adds
	text string
}

var heredocRE = regexp.MustCompile(`<<-?\s*['"]?([A-Za-z_][A-Za-z0-9_]*)['"]?`)

// splitCommands splits a block into the commands a user pastes one at a time: a line, with its
// backslash continuations and its here-document. Comment-only and blank lines are left out.
func splitCommands(b shBlock) []shCommand {
	lines := strings.Split(b.text, "\n")
	var out []shCommand
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimSpace(lines[i])
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		c := shCommand{line: b.line + i, text: lines[i]}
		for strings.HasSuffix(strings.TrimRight(lines[i], " \t"), `\`) && i+1 < len(lines) {
			i++
			c.text += "\n" + lines[i]
		}
		if m := heredocRE.FindStringSubmatch(c.text); m != nil {
			for i+1 < len(lines) {
				i++
				c.text += "\n" + lines[i]
				if strings.TrimSpace(lines[i]) == m[1] {
					break
				}
			}
		}
		out = append(out, c)
	}
	return out
}

// tourDir is a checkout after `make run`: bin/fleetctl, .data/tokens, and fleetd running.
type tourDir struct {
	dir     string
	api     string // http://host:port
	natsURL string
	env     []string
	// assignments are the variable assignments run so far (export X=..., TOKEN=$(...)); every
	// later command runs after them, as in the user's shell.
	assignments []string
}

func newTourDir(t *testing.T, fleetctl string) *tourDir {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"bin", ".data/fleetd"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(fleetctl, filepath.Join(dir, "bin", "fleetctl")); err != nil {
		t.Fatal(err)
	}
	// As make run's $(DATA)/tokens rule: 32 random bytes in hex, user dev-admin.
	var secret [32]byte
	_, _ = rand.Read(secret[:])
	tokens := filepath.Join(dir, ".data", "tokens")
	if err := os.WriteFile(tokens, []byte(hex.EncodeToString(secret[:])+",dev-admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// As make run's $(DATA)/nats-admin.token rule.
	_, _ = rand.Read(secret[:])
	adminToken := filepath.Join(dir, ".data", "nats-admin.token")
	if err := os.WriteFile(adminToken, []byte(hex.EncodeToString(secret[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := fleetd.Config{
		DataDir:      filepath.Join(dir, ".data", "fleetd"),
		Server:       server.Config{Listen: "127.0.0.1:0", TokenFile: tokens},
		NATSListen:   "127.0.0.1:0",
		XDSListen:    "127.0.0.1:0",
		HostedAgents: true,
		Authz:        authz.Config{PlatformAdmins: []string{"dev-admin"}},
		// make run's --nats-admin-token-file.
		NATSAdminTokenFile: adminToken,
	}
	inst, err := fleetd.Start(ctx, cfg, testkit.Logger(t))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); inst.Stop() })
	select {
	case <-inst.Ready():
	case <-time.After(60 * time.Second):
		t.Fatal("fleetd not ready")
	}
	w := &tourDir{dir: dir, api: "http://" + inst.Addr, natsURL: inst.NATS.ClientURL()}
	for _, kv := range os.Environ() {
		// The developer's own fleet settings must not leak into the commands.
		if !strings.HasPrefix(kv, "FLEETSTREAM_") {
			w.env = append(w.env, kv)
		}
	}
	// Contexts go to the tour's own configuration file, not the developer's.
	w.env = append(w.env, "FLEETSTREAM_SERVER="+w.api, "FLEETSTREAM_TOKEN_FILE=.data/tokens",
		"FLEETSTREAM_CONFIG="+filepath.Join(dir, ".data", "fleetctl.yaml"))
	return w
}

// gitopsExample copies examples/gitops into the tour, where a checkout has it.
func gitopsExample(t *testing.T, w *tourDir) {
	t.Helper()
	src := "../../../examples/gitops"
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		dst := filepath.Join(w.dir, "examples", "gitops", rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

var curlRE = regexp.MustCompile(`(^|[\s|;&(])curl `)

var assignmentRE = regexp.MustCompile(`^(export\s+)?[A-Za-z_][A-Za-z0-9_]*=(\$\([^()]*\)|"[^"]*"|'[^']*'|\S*)(\s+#.*)?$`)

// followers are commands the README says run until interrupted.
var followers = []string{"bin/fleetctl events tail"}

// run runs one README command as written (but for the substitutions the file comment lists)
// and fails the test, naming the README line, unless it exits 0.
func (w *tourDir) run(t *testing.T, c shCommand) {
	t.Helper()
	where := fmt.Sprintf("README.md:%d", c.line)
	if c.line == 0 {
		where = "added by the test"
	}
	text := strings.ReplaceAll(c.text, "http://127.0.0.1:8080", w.api)
	text = curlRE.ReplaceAllString(text, "${1}curl --fail-with-body ")
	text = strings.ReplaceAll(text, "bin/fleetctl events tail ", "bin/fleetctl events tail --nats-url "+w.natsURL+" ")
	text = strings.ReplaceAll(text, "bin/fleetctl admin ", "bin/fleetctl admin --nats-url "+w.natsURL+" ")
	follow := false
	for _, f := range followers {
		if strings.HasPrefix(strings.TrimSpace(text), f) {
			// exec: the interrupt reaches fleetctl itself, whose exit status is the command's.
			follow, text = true, "exec "+strings.TrimSpace(text)
		}
	}
	script := strings.Join(append(append([]string{"set -eo pipefail"}, w.assignments...), text), "\n")
	if assignmentRE.MatchString(strings.TrimSpace(c.text)) {
		w.assignments = append(w.assignments, text)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir, cmd.Env = w.dir, w.env
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if !follow {
		err := cmd.Run()
		if err != nil {
			t.Fatalf("%s: %s\nfailed: %v\noutput:\n%s", where, c.text, err, out.String())
		}
		t.Logf("%s: %s\n%s", where, c.text, out.String())
		return
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(time.Minute)
	for printed := false; !printed; {
		select {
		case err := <-done:
			t.Fatalf("%s: %s\nended before it was interrupted: %v\noutput:\n%s", where, c.text, err, out.String())
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatalf("%s: %s\nprinted nothing in a minute; output:\n%s", where, c.text, out.String())
		case <-time.After(100 * time.Millisecond):
			printed = strings.Contains(out.String(), "\n")
		}
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	if err := <-done; err != nil {
		t.Fatalf("%s: %s\ninterrupted, it failed: %v\noutput:\n%s", where, c.text, err, out.String())
	}
	t.Logf("%s: %s (interrupted)\n%s", where, c.text, out.String())
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// importFiles prepares what the README's import block uses and does not make itself: the
// policy file docs/import.md writes out (read from there, so it is tested too), the Cluster API
// Cluster and kubeconfig Secret its kubectl commands would fetch from a management cluster, and
// the policy's source cluster registered ("needs its source cluster registered"), as
// docs/import.md's first step does.
func importFiles(t *testing.T, w *tourDir) {
	t.Helper()
	doc, err := os.ReadFile("../../../docs/import.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := bytes.Cut(doc, []byte("`capi-policy.yaml`:\n"))
	if !ok {
		t.Fatal("docs/import.md no longer has the `capi-policy.yaml`: block the README's import commands use")
	}
	_, after, ok = bytes.Cut(after, []byte("```yaml\n"))
	policy, _, ok2 := bytes.Cut(after, []byte("\n```"))
	if !ok || !ok2 {
		t.Fatal("docs/import.md: no ```yaml block after `capi-policy.yaml`:")
	}
	kubeconfig := base64.StdEncoding.EncodeToString([]byte(`apiVersion: v1
kind: Config
clusters: [{name: prod-eu, cluster: {server: "https://prod-eu.example:6443"}}]
users: [{name: admin, user: {token: t0ken}}]
contexts: [{name: prod-eu, context: {cluster: prod-eu, user: admin}}]
current-context: prod-eu
`))
	files := map[string]string{
		"capi-policy.yaml": string(policy) + "\n",
		"cluster.yaml": `apiVersion: cluster.x-k8s.io/v1beta1
kind: Cluster
metadata:
  name: prod-eu
  namespace: fleet
  labels: {fleetstream.io/import: "true", topology.kubernetes.io/region: eu-west-1}
spec: {}
status:
  conditions:
  - {type: Ready, status: "True"}
`,
		"secret.yaml": fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: prod-eu-kubeconfig, namespace: fleet}
type: cluster.x-k8s.io/secret
data:
  value: %s
`, kubeconfig),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(w.dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	w.run(t, shCommand{line: 0, text: "bin/fleetctl cluster register mgmt"})
}
