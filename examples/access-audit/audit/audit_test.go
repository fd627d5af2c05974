package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/examples/access-audit/audit"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subscribe"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// syncBuffer is the audit log, read while the example writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// The example end to end against fleetd, as its README runs it against `make run`: a platform
// admin makes the subscriber, a project gets a namespace and a member who is later removed,
// and the audit log shows each step, attributed.
func TestAccessAuditEndToEnd(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("admin-token,admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inst, err := fleetd.Start(ctx, fleetd.Config{DataDir: filepath.Join(dir, "data"), NATSListen: "127.0.0.1:0",
		Server: server.Config{Listen: "127.0.0.1:0", TokenFile: tokens}, Authz: authz.Config{PlatformAdmins: []string{"admin"}}}, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Stop()
	<-inst.Ready()
	call := func(proc, body string) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+inst.Addr+proc, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer admin-token")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", proc, res.StatusCode, data)
		}
		var out map[string]any
		_ = json.Unmarshal(data, &out)
		return out
	}
	sub := call("/fleetstream.cluster.v1.SubscriberService/CreateSubscriber", `{"name":"access-audit","streams":["FLEET_RBAC","FLEET_NS"]}`)
	token, _ := sub["token"].(string)
	call("/fleetstream.cluster.v1.ClusterService/RegisterCluster", `{"name":"c1"}`)
	call("/fleetstream.project.v1.ProjectService/CreateProject", `{"name":"team-a"}`)
	call("/fleetstream.project.v1.ProjectService/BindNamespace", `{"project":"team-a","cluster":"c1","namespace":"web"}`)
	grant := `{"project":"team-a","subject":{"kind":"SUBJECT_KIND_USER","name":"alice"},"roleTemplate":"project-member"}`
	call("/fleetstream.rbac.v1.RBACService/BindProjectRole", grant)

	var log syncBuffer
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		errc <- audit.Run(runCtx, subscribe.Config{URL: inst.NATS.ClientURL(), Name: "access-audit", Token: token, FromSequence: 1}, &log, testkit.Logger(t))
	}()
	call("/fleetstream.rbac.v1.RBACService/UnbindProjectRole", grant)
	want := []string{
		`"action":"namespace-bound","project":"team-a","cluster":"c1","namespace":"web"`,
		`"actor":"admin","action":"grant","project":"team-a","subject":"user:alice","role":"project-member"`,
		`"actor":"admin","action":"revoke","project":"team-a","subject":"user:alice","role":"project-member"`,
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := log.String()
		missing := ""
		for _, w := range want {
			if !strings.Contains(got, w) {
				missing = w
			}
		}
		if missing == "" {
			// A grant comes before its revocation in the log.
			if strings.Index(got, `"action":"grant"`) > strings.Index(got, `"action":"revoke"`) {
				t.Fatalf("revocation logged before the grant:\n%s", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit log lacks %s:\n%s", missing, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		var r audit.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.EventID == "" || r.Time == "" {
			t.Fatalf("not a record: %q (%v)", line, err)
		}
	}
	stop()
	if err := <-errc; err != nil {
		t.Fatal(fmt.Errorf("audit stopped: %w", err))
	}
}
