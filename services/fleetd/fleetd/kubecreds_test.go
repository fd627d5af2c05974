package fleetd_test

import (
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/sealed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// authHeaders is a TLS server that records the Authorization header of every request.
type authHeaders struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []string
}

func newAuthHeaders(t *testing.T) *authHeaders {
	a := &authHeaders{}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.got = append(a.got, r.Header.Get("Authorization"))
		a.mu.Unlock()
		http.Error(w, "not an apiserver", http.StatusServiceUnavailable)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *authHeaders) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.got...)
}

// kubeconfig reaches the test server, its CA given inline, with user as the user's fields.
func (a *authHeaders) kubeconfig(user string) []byte {
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.srv.Certificate().Raw})
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, certificate-authority-data: %s}
users:
- name: u
  user: %s
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`, a.srv.URL, base64.StdEncoding.EncodeToString(ca), user))
}

// Stored credentials written before they were checked (here: sealed straight into the bucket,
// as older versions stored whatever they were given) are refused again when a hosted agent
// loads them: the exec plugin, which would create a marker file, never runs, and the hub file
// a tokenFile names is never sent to the kubeconfig's server. The hosted agent says why and
// does not connect; new inline credentials through the API bring it up.
func TestHostedAgentRefusesStoredCredentialsThatAreNotInlineData(t *testing.T) {
	api := newAuthHeaders(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "exec-ran")
	secretFile := filepath.Join(dir, "hub-secret")
	const hubSecret = "hub-secret-c0ffee-4242"
	if err := os.WriteFile(secretFile, []byte(hubSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"exec":      fmt.Sprintf(`{exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, "touch %s"]}}`, marker),
		"tokenfile": fmt.Sprintf(`{tokenFile: %q}`, secretFile),
	}
	field := map[string]string{"exec": "users[0].user.exec", "tokenfile": "users[0].user.tokenFile"}
	dataDir := filepath.Join(dir, "data")
	useDir := func(c *fleetd.Config) { c.DataDir = dataDir }

	// An older hub: the clusters are registered with inline credentials, then their stored
	// values are replaced behind the API. No hosted agents run yet.
	old, client := startFleetd(t, useDir)
	ctx := testkit.Context(t, 2*time.Minute)
	ring, err := sealed.LoadKeyring(fleetd.DefaultCredentialsKeyFile(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := old.JS.KeyValue(ctx, subjects.ClusterCredentialsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for name, user := range bad {
		reg, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name,
			Credentials: &clusterv1.ConnectionCredentials{Kubeconfig: api.kubeconfig(`{token: "inline"}`)}}))
		if err != nil {
			t.Fatal(err)
		}
		id := reg.Msg.Cluster.Id
		e, err := kv.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		sec := &clusterv1.ClusterSecrets{}
		if err := proto.Unmarshal(e.Value(), sec); err != nil {
			t.Fatal(err)
		}
		plain, err := proto.Marshal(&clusterv1.ConnectionCredentials{Kubeconfig: api.kubeconfig(user)})
		if err != nil {
			t.Fatal(err)
		}
		if sec.SealedCredentials, err = ring.Seal(plain, []byte(subjects.ClusterCredentialsBucket+"/"+id)); err != nil {
			t.Fatal(err)
		}
		data, err := proto.Marshal(sec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, id, data); err != nil {
			t.Fatal(err)
		}
	}
	old.Stop()

	// This hub runs the hosted agents on the same data.
	inst, client := startFleetd(t, useDir, withHostedAgents)
	attacked := func() {
		t.Helper()
		if _, err := os.Stat(marker); !os.IsNotExist(err) {
			t.Fatalf("the exec plugin ran on the hub: %v", err)
		}
		for _, h := range api.seen() {
			if strings.Contains(h, hubSecret) {
				t.Fatalf("the hub file was sent to the kubeconfig's server: %q", h)
			}
		}
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		attacked()
		refused := inst.Hosted.Refused()
		for name, f := range field {
			if !strings.Contains(refused[name], f) {
				return fmt.Errorf("refused %v, want %s of %s named", refused, f, name)
			}
		}
		return nil
	})
	for name, why := range inst.Hosted.Refused() {
		if strings.Contains(why, secretFile) || strings.Contains(why, marker) {
			t.Errorf("%s: the reason quotes the kubeconfig: %s", name, why)
		}
	}
	// Past a retry period (1 s here): the refused credentials are not tried again.
	time.Sleep(2 * time.Second)
	attacked()
	if got := api.seen(); len(got) != 0 {
		t.Fatalf("the kubeconfigs' server was called %d times (authorization %q)", len(got), got)
	}
	for name := range bad {
		if err := hostedConnected(ctx, client, name, true); err == nil {
			t.Errorf("cluster %s is connected", name)
		}
	}

	// New inline credentials through the API: the hosted agent starts and uses them.
	if _, err := client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "tokenfile",
		Credentials: &clusterv1.ConnectionCredentials{Kubeconfig: api.kubeconfig(`{token: "replaced"}`)},
		UpdateMask:  &fieldmaskpb.FieldMask{Paths: []string{"credentials"}}})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		if why, ok := inst.Hosted.Refused()["tokenfile"]; ok {
			return fmt.Errorf("still refused: %s", why)
		}
		for _, h := range api.seen() {
			if h == "Bearer replaced" {
				return nil
			}
		}
		return fmt.Errorf("server saw %q", api.seen())
	})
	attacked()
}
