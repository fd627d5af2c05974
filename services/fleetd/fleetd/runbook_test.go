package fleetd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

const operationsPath = "../../../docs/operations.md"

// natsCLI is the pinned NATS CLI `make nats-cli` installs into ./bin. Without it the test skips,
// unless FLEETSTREAM_REQUIRE_NATS_CLI is set (CI's `make test` sets it: there a missing CLI is a
// failure, as a missing browser is).
func natsCLI(t *testing.T) string {
	p, err := filepath.Abs("../../../bin/nats")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if os.Getenv("FLEETSTREAM_REQUIRE_NATS_CLI") != "" {
		t.Fatalf("no NATS CLI at %s and FLEETSTREAM_REQUIRE_NATS_CLI is set (make nats-cli)", p)
	}
	t.Skipf("no NATS CLI at %s (make nats-cli); set FLEETSTREAM_REQUIRE_NATS_CLI=1 to make this a failure", p)
	return ""
}

// runbookCommand is one `fnats …` or `fnats-admin …` command of the alerts' runbooks.
type runbookCommand struct {
	alias string // fnats or fnats-admin
	args  string // what follows the alias, placeholders in place
}

// runbookCommands returns every NATS CLI command quoted in docs/operations.md's "## Alerts"
// section (up to the next second-level heading), in order, each once.
func runbookCommands(t *testing.T, doc string) []runbookCommand {
	_, alerts, ok := strings.Cut(doc, "\n## Alerts\n")
	if !ok {
		t.Fatalf("%s has no \"## Alerts\" section", operationsPath)
	}
	if i := strings.Index(alerts, "\n## "); i >= 0 {
		alerts = alerts[:i]
	}
	var out []runbookCommand
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile("`(fnats(?:-admin)?) ([^`]+)`").FindAllStringSubmatch(alerts, -1) {
		if seen[m[0]] {
			continue
		}
		seen[m[0]] = true
		out = append(out, runbookCommand{alias: m[1], args: m[2]})
	}
	return out
}

// Every NATS CLI command the alerts' runbooks (docs/operations.md) tell an operator to run works
// as written: run by the pinned NATS CLI with the identity its alias gives (fnats: one hub
// service's token and inbox prefix; fnats-admin: the fleetstream-admin user) against fleetd's
// embedded server, which admits them with the permissions of pkg/natsauth, as the deployed
// cluster's auth callout does. Each must exit 0 and print what the runbook says to look for. A
// command a service's permissions refuse, a wrong flag or a placeholder the test does not know
// fails here, as would an alias whose identity differs from the one the test connects as.
func TestOperationsRunbookNATSCommands(t *testing.T) {
	cli := natsCLI(t)
	data, err := os.ReadFile(operationsPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	// The aliases the runbooks define: the test connects as they do.
	for _, want := range []string{
		`alias fnats="nats --server `, `--token $(kubectl -n fleetstream get secret fleetstream-nats-$svc`, `--inbox-prefix _INBOX_svc_$svc"`,
		`svc=rbac-sync`,
		`alias fnats-admin="nats --server `, `--user ` + natsauth.AdminUser + ` `, `--inbox-prefix ` + natsauth.ServiceInboxPrefix(natsauth.AdminUser) + `"`,
	} {
		if !strings.Contains(doc, want) {
			t.Fatalf("%s: the aliases no longer contain %q; the test connects as they did", operationsPath, want)
		}
	}
	commands := runbookCommands(t, doc)
	if len(commands) < 5 {
		t.Fatalf("found %d NATS CLI commands in the runbooks; the extraction is broken", len(commands))
	}

	// The services the alias names (svc=…), each with a view of its own stream and a lease of
	// its writer: the placeholders VIEW, STREAM and <lease> of its runbook commands.
	type service struct{ name, view, stream, lease string }
	services := []service{
		{natsauth.ServiceRBACSync, rbacsync.TemplatesBucket, rbacsync.Stream, rbacsync.FanoutLease},
		{natsauth.ServiceNamespaceBinding, subjects.NamespaceBindingsBucket, subjects.NamespaceStream, namespacebinding.PlacementLease},
		{natsauth.ServiceEndpointCollector, subjects.EndpointWeightsBucket, subjects.EndpointStream, collector.WriterLease},
	}
	if !strings.Contains(doc, "svc=rbac-sync   # or namespace-binding, endpoint-collector") {
		t.Fatalf("%s: the alias no longer names rbac-sync, namespace-binding and endpoint-collector; the test connects as each", operationsPath)
	}

	ctx := testkit.Context(t, 3*time.Minute)
	dir := t.TempDir()
	const adminToken = "admin-token-0123456789abcdef"
	adminFile := filepath.Join(dir, "nats-admin.token")
	if err := os.WriteFile(adminFile, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for _, svc := range services {
		tokens[svc.name] = svc.name + "-token-0123456789abcdef"
	}
	inst := startData(t, ctx, fleetd.Config{DataDir: filepath.Join(dir, "data"), Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true},
		NATSListen: "127.0.0.1:0", NATSAdminTokenFile: adminFile, NATSServiceTokens: tokens})

	// A poison event: the role templates' view cannot decode it and dead-letters it, so FLEET_DLQ
	// has a source to look at (every service may read FLEET_DLQ).
	if _, err := inst.JS.Publish(ctx, rbacsync.TemplateSubject("poison"), []byte("not an event")); err != nil {
		t.Fatal(err)
	}
	source := rbacsync.Stream + ".view-" + rbacsync.TemplatesBucket
	testkit.Eventually(t, 30*time.Second, func() error {
		s, err := inst.JS.Stream(ctx, topology.DeadLetterStreamName)
		if err != nil {
			return err
		}
		if _, err := s.GetLastMsgForSubject(ctx, topology.DeadLetterSubjectPrefix+"."+source); err != nil {
			return fmt.Errorf("the poison event is not dead-lettered yet: %w", err)
		}
		return nil
	})

	home := t.TempDir() // no operator's contexts or settings
	if _, err := exec.LookPath("script"); err != nil {
		t.Fatal("no script(1) on PATH, which gives `stream view` its terminal (apt-get install -y bsdutils)")
	}
	cliEnv := append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "NO_COLOR=1")
	serviceArgs := func(svc string) []string {
		return []string{"--server", inst.NATS.ClientURL(), "--token", tokens[svc], "--inbox-prefix", natsauth.ServiceInboxPrefix(svc)}
	}
	adminArgs := []string{"--server", inst.NATS.ClientURL(), "--user", natsauth.AdminUser, "--password", adminToken, "--inbox-prefix", natsauth.ServiceInboxPrefix(natsauth.AdminUser)}

	// Why the runbooks send these two through fnats-admin: a hub service may not list the
	// streams nor ask the servers for reports (no Fleetstream identity is in the system
	// account but cluster-import's, which may only list and close connections).
	for args, refused := range map[string]string{
		"stream report":           `Permissions Violation for Publish to "$JS.API.STREAM.LIST"`,
		"server report jetstream": `Permissions Violation for Publish to "$SYS.REQ.SERVER.PING.JSZ"`,
	} {
		// The CLI waits --timeout for answers a refused request never gets.
		cmd := exec.CommandContext(ctx, cli, append(serviceArgs(natsauth.ServiceRBACSync), append([]string{"--timeout", "1s"}, strings.Fields(args)...)...)...)
		cmd.Env = cliEnv
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), refused) {
			t.Errorf("as rbac-sync, nats %s: %v, want it refused with %s; it printed:\n%s", args, err, refused, out)
		}
	}

	holder := `: \S+/\d+#[0-9a-f]+$` // a lease's value, host/pid#id
	dlq := regexp.QuoteMeta(topology.DeadLetterSubjectPrefix + "." + source)
	for i, svc := range services {
		// What each command must print: what the runbook reads in it, each pattern on a line of
		// its own. A command without an entry fails, so a new one in the doc cannot go
		// untested, nor one moved to another alias.
		lease := regexp.QuoteMeta(svc.lease)
		expect := map[string][]string{
			"fnats-admin stream report":           {`^│ ` + svc.stream + ` +│ File`, `^│ KV_fleet-leases +│ File`},
			"fnats kv get fleet-leases view.VIEW": {`^fleet-leases > view\.` + svc.view + ` revision`, `^\S+/\d+#[0-9a-f]+$`},
			"fnats kv get VIEW =meta":             {`^` + svc.view + ` > =meta revision`},
			"fnats stream info STREAM":            {`^Information for Stream ` + svc.stream, `Subjects: fleet\.`},
			"fnats kv watch fleet-leases":         {`PUT fleet-leases > view\.` + svc.view + holder, `PUT fleet-leases > ` + lease + holder},
			"fnats stream info KV_fleet-leases":   {`^Information for Stream KV_fleet-leases`},
			"fnats kv get fleet-leases <lease>":   {`^fleet-leases > ` + lease + ` revision`, `^\S+/\d+#[0-9a-f]+$`},
			"fnats stream subjects FLEET_DLQ":     {`│ ` + dlq + ` +│ 1 +│`},
			"fnats stream view FLEET_DLQ --subject fleet.dlq.SOURCE": {
				`Subject: ` + dlq + ` Received`,
				`Fleet-Dlq-Stream: ` + rbacsync.Stream + `$`,
				`Fleet-Dlq-Sequence: \d+$`,
				`Fleet-Dlq-Subject: ` + regexp.QuoteMeta(rbacsync.TemplateSubject("poison")) + `$`,
				`Fleet-Dlq-Error: decode envelope`,
			},
		}
		placeholders := strings.NewReplacer("VIEW", svc.view, "STREAM", svc.stream, "SOURCE", source, "<lease>", svc.lease)
		for _, c := range commands {
			name := c.alias + " " + c.args
			if c.alias == "fnats-admin" && i > 0 {
				continue // the same user whichever service fnats is
			}
			t.Run(svc.name+"/"+name, func(t *testing.T) {
				want, ok := expect[name]
				if !ok {
					t.Fatalf("docs/operations.md runs %q, which this test has no expectation for: add one", name)
				}
				if strings.ContainsAny(c.args, `"'$|;&`) {
					t.Fatalf("%q: the test splits commands on spaces only", name)
				}
				args := adminArgs
				if c.alias == "fnats" {
					args = serviceArgs(svc.name)
				}
				args = append(slices.Clone(args), strings.Fields(placeholders.Replace(c.args))...)
				// A watch never ends by itself: it runs a few seconds, enough to print what
				// the bucket holds.
				watch := strings.HasPrefix(c.args, "kv watch ")
				timeout := 20 * time.Second
				if watch {
					timeout = 3 * time.Second
				}
				cctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				cmd := exec.CommandContext(cctx, cli, args...)
				if strings.HasPrefix(c.args, "stream view ") {
					// It pages, and refuses to start without a terminal: script(1) gives it
					// one, as the operator's shell does. With less than a page to show it
					// ends by itself.
					quoted := make([]string, 0, len(args)+1)
					for _, a := range append([]string{cli}, args...) {
						quoted = append(quoted, "'"+a+"'")
					}
					cmd = exec.CommandContext(cctx, "script", "-qec", strings.Join(quoted, " "), "/dev/null")
				}
				cmd.Env = cliEnv
				start := time.Now()
				out, err := cmd.CombinedOutput()
				t.Logf("%s (%v):\n%s", strings.Join(cmd.Args, " "), time.Since(start).Round(time.Millisecond), out)
				if err != nil && !(watch && cctx.Err() != nil) {
					t.Fatalf("%s: %v", name, err)
				}
				lines := strings.ReplaceAll(string(out), "\r\n", "\n") // script(1)'s terminal ends lines with CR LF
				for _, w := range want {
					if !regexp.MustCompile(`(?m)` + w).MatchString(lines) {
						t.Errorf("%s printed no line matching %s", name, w)
					}
				}
			})
		}
	}
}

// A service token fleetd is given must be long enough and must not be one of the services fleetd
// makes tokens for itself, whose connections it would otherwise break or impersonate.
func TestNATSServiceTokensAreChecked(t *testing.T) {
	for name, c := range map[string]struct {
		tokens map[string]string
		want   string
	}{
		"short":   {map[string]string{natsauth.ServiceRBACSync: "short"}, "the token of rbac-sync is 5 characters"},
		"own":     {map[string]string{natsauth.ServiceHostedAgent: "hosted-token-0123456789abcdef"}, "hosted-agent runs in fleetd with a token of its own"},
		"unknown": {map[string]string{"rbac-synk": "rbac-synk-token-0123456789abcdef"}, `unknown service "rbac-synk"`},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := fleetd.Config{DataDir: filepath.Join(t.TempDir(), "d"), Server: server.Config{Listen: "127.0.0.1:0", InsecureDev: true},
				NATSListen: "127.0.0.1:0", NATSServiceTokens: c.tokens}
			inst, err := fleetd.Start(context.Background(), cfg, testkit.Logger(t))
			if err == nil {
				inst.Stop()
				t.Fatalf("fleetd started with service tokens %v", c.tokens)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("service tokens %v: %v; want %q", c.tokens, err, c.want)
			}
		})
	}
}
