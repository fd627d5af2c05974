package clusterimport_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/sealed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// keyLines holds generated key file lines by key id, so a test can write any combination.
type keyLines map[string]string

func (k keyLines) line(t testing.TB, id string) string {
	t.Helper()
	if l, ok := k[id]; ok {
		return l
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	k[id] = id + ":" + base64.StdEncoding.EncodeToString(b) + "\n"
	return k[id]
}

// write writes a key file listing ids in order (the first seals) and loads it.
func (k keyLines) write(t testing.TB, path string, ids ...string) *sealed.Keyring {
	t.Helper()
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(k.line(t, id))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := sealed.LoadKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newRing(t testing.TB, ids ...string) *sealed.Keyring {
	t.Helper()
	return keyLines{}.write(t, filepath.Join(t.TempDir(), "keys"), ids...)
}

const (
	secretToken     = "tok-Sekr1t-bearer-7f3a"
	secretKeyData   = "KEYDATA-Sekr1t-9c2e"
	secretKubeToken = "kc-Sekr1t-token-41d8"
	secretNewToken  = "tok-Sekr1t-rotated-55b0"
)

func tokenCreds(token string) *clusterv1.ConnectionCredentials {
	return &clusterv1.ConnectionCredentials{
		Server:                   "https://10.0.0.1:6443",
		CertificateAuthorityData: []byte("-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n"),
		Token:                    token,
		ClientCertificateData:    []byte("-----BEGIN CERTIFICATE-----\ncert\n-----END CERTIFICATE-----\n"),
		ClientKeyData:            []byte("-----BEGIN EC PRIVATE KEY-----\n" + secretKeyData + "\n-----END EC PRIVATE KEY-----\n"),
	}
}

func kubeconfigCreds() *clusterv1.ConnectionCredentials {
	return &clusterv1.ConnectionCredentials{Kubeconfig: []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.2:6443"}
users:
- name: u
  user: {token: "` + secretKubeToken + `"}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
`)}
}

// secretForms are every way a secret could show: as is, and base64 of each whole bytes field
// (how JSON carries bytes).
func secretForms() []string {
	forms := []string{secretToken, secretKeyData, secretKubeToken, secretNewToken}
	for _, c := range []*clusterv1.ConnectionCredentials{tokenCreds(secretToken), kubeconfigCreds()} {
		for _, b := range [][]byte{c.ClientKeyData, c.Kubeconfig} {
			if len(b) > 0 {
				forms = append(forms, base64.StdEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b))
			}
		}
	}
	for _, s := range []string{secretToken, secretKeyData, secretKubeToken, secretNewToken} {
		forms = append(forms, base64.StdEncoding.EncodeToString([]byte(s)))
	}
	return forms
}

func assertNoSecret(t *testing.T, where string, data []byte) {
	t.Helper()
	for _, s := range secretForms() {
		if bytes.Contains(data, []byte(s)) {
			t.Errorf("%s contains secret %q", where, s)
		}
	}
}

// recorder keeps every HTTP response body, as received on the wire (decompressed).
type recorder struct {
	mu     sync.Mutex
	bodies bytes.Buffer
}

func (r *recorder) client(base *http.Client) *http.Client {
	c := *base
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	c.Transport = roundTripper(func(req *http.Request) (*http.Response, error) {
		res, err := next.RoundTrip(req)
		if err != nil {
			return res, err
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return nil, err
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		plain := body
		if res.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader(body))
			if err != nil {
				return nil, err
			}
			if plain, err = io.ReadAll(zr); err != nil {
				return nil, err
			}
		}
		r.mu.Lock()
		r.bodies.Write(plain)
		r.bodies.WriteByte('\n')
		r.mu.Unlock()
		return res, nil
	})
	return &c
}

// allStreamBytes is every message body and header of every stream on the server: events,
// KV buckets (credentials included), views, dead letters.
func allStreamBytes(t *testing.T, ctx context.Context, js jetstream.JetStream) (all []byte, credentials [][]byte) {
	t.Helper()
	names := js.StreamNames(ctx)
	var streams []string
	for n := range names.Name() {
		streams = append(streams, n)
	}
	if names.Err() != nil {
		t.Fatal(names.Err())
	}
	for _, name := range streams {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				t.Fatalf("%s #%d: %v", name, seq, err)
			}
			all = append(all, m.Data...)
			all = append(all, fmt.Sprint(m.Header)...)
			if name == "KV_"+subjects.ClusterCredentialsBucket {
				credentials = append(credentials, m.Data)
			}
		}
	}
	return all, credentials
}

func TestCredentialsNeverAppearInKVEventsAPIOrLogs(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	e := startLogged(t, nil, clusterimport.Config{}, zap.New(core))
	ctx := testkit.Context(t, 60*time.Second)
	var rec recorder
	client := clusterv1connect.NewClusterServiceClient(rec.client(testkit.BearerClient(http.DefaultClient, testToken)), e.url, connect.WithProtoJSON())

	reg, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1", Credentials: tokenCreds(secretToken)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c2", Credentials: kubeconfigCreds()})); err != nil {
		t.Fatal(err)
	}
	if _, err := client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{
		Name: "c1", Credentials: tokenCreds(secretNewToken), UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credentials"}},
	})); err != nil {
		t.Fatal(err)
	}
	// Rejected requests carrying secrets: the errors must not echo them.
	bad := []*clusterv1.RegisterClusterRequest{
		{Name: "c3", Credentials: &clusterv1.ConnectionCredentials{Kubeconfig: append([]byte("{{{"), secretKubeToken...)}},
		{Name: "c3", Credentials: &clusterv1.ConnectionCredentials{Kubeconfig: kubeconfigCreds().Kubeconfig, Token: secretToken}},
		{Name: "c1", Credentials: tokenCreds(secretToken)}, // exists
	}
	for _, req := range bad {
		if _, err := client.RegisterCluster(ctx, connect.NewRequest(req)); err == nil {
			t.Fatalf("accepted %v", req.Name)
		} else {
			assertNoSecret(t, "error "+err.Error(), []byte(err.Error()))
		}
	}
	get, err := client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c1", IncludeInventory: true}))
	if err != nil {
		t.Fatal(err)
	}
	list, err := client.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	if err != nil || len(list.Msg.Clusters) != 2 {
		t.Fatalf("list: %v %v", list, err)
	}
	if !get.Msg.Cluster.Status.CredentialsSet {
		t.Fatal("credentials not marked set")
	}

	// The decrypting path gives back what was stored.
	for name, want := range map[string]*clusterv1.ConnectionCredentials{"c1": tokenCreds(secretNewToken), "c2": kubeconfigCreds()} {
		got, err := e.svc.Credentials(ctx, name)
		if err != nil || !proto.Equal(got, want) {
			t.Fatalf("credentials of %s: %v %v", name, got, err)
		}
	}

	all, stored := allStreamBytes(t, ctx, e.js.JS)
	if len(stored) != 2 {
		t.Fatalf("%d values in the credentials bucket, want 2", len(stored))
	}
	assertNoSecret(t, "the NATS streams (KV buckets, events)", all)
	for _, v := range stored {
		sec := &clusterv1.ClusterSecrets{}
		if err := proto.Unmarshal(v, sec); err != nil {
			t.Fatal(err)
		}
		if sec.Credentials != nil || len(sec.SealedCredentials) == 0 {
			t.Fatalf("stored value not sealed: %v", sec)
		}
		if id, err := sealed.KeyID(sec.SealedCredentials); err != nil || id != "test-key" {
			t.Fatalf("key id %q %v", id, err)
		}
	}
	rec.mu.Lock()
	wire := rec.bodies.Bytes()
	rec.mu.Unlock()
	if !bytes.Contains(wire, []byte(reg.Msg.Cluster.Id)) {
		t.Fatal("recorder saw no response bodies")
	}
	assertNoSecret(t, "API responses", wire)
	for _, m := range []proto.Message{get.Msg, list.Msg, reg.Msg} {
		assertNoSecret(t, "API response JSON", []byte(protojson.Format(m)))
	}
	if logs.Len() == 0 {
		t.Fatal("no log entries captured")
	}
	var logText strings.Builder
	for _, entry := range logs.All() {
		fmt.Fprintf(&logText, "%s %s %v\n", entry.LoggerName, entry.Message, entry.ContextMap())
	}
	assertNoSecret(t, "logs", []byte(logText.String()))
}

func TestStoredCredentialsAreBoundToTheirCluster(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	for _, name := range []string{"c1", "c2"} {
		if _, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name, Credentials: tokenCreds(secretToken + name)})); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := e.js.JS.KeyValue(ctx, subjects.ClusterCredentialsBucket)
	if err != nil {
		t.Fatal(err)
	}
	id := func(name string) string {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.Cluster.Id
	}
	c1, c2 := id("c1"), id("c2")
	stored := func(id string) *clusterv1.ClusterSecrets {
		en, err := kv.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		sec := &clusterv1.ClusterSecrets{}
		if err := proto.Unmarshal(en.Value(), sec); err != nil {
			t.Fatal(err)
		}
		return sec
	}
	put := func(id string, sec *clusterv1.ClusterSecrets) {
		data, _ := proto.Marshal(sec)
		if _, err := kv.Put(ctx, id, data); err != nil {
			t.Fatal(err)
		}
	}
	orig := stored(c2)
	cases := []struct {
		name   string
		tamper func(sec *clusterv1.ClusterSecrets)
	}{
		// c1's sealed credentials copied into c2's value (an attacker with write access to the
		// bucket pointing c2's agent at c1's cluster).
		{"swapped from another cluster", func(sec *clusterv1.ClusterSecrets) { sec.SealedCredentials = stored(c1).SealedCredentials }},
		{"flipped ciphertext byte", func(sec *clusterv1.ClusterSecrets) { sec.SealedCredentials[len(sec.SealedCredentials)-30] ^= 1 }},
		{"flipped tag byte", func(sec *clusterv1.ClusterSecrets) { sec.SealedCredentials[len(sec.SealedCredentials)-1] ^= 1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sec := proto.CloneOf(orig)
			tc.tamper(sec)
			put(c2, sec)
			_, err := e.svc.Credentials(ctx, "c2")
			if err == nil || !strings.Contains(err.Error(), "authentication failed") || !strings.Contains(err.Error(), `"test-key"`) {
				t.Fatalf("tampered value: %v", err)
			}
			assertNoSecret(t, "error", []byte(err.Error()))
			if strings.Contains(err.Error(), secretToken) {
				t.Fatalf("error shows a token: %v", err)
			}
		})
	}
	put(c2, orig)
	if got, err := e.svc.Credentials(ctx, "c2"); err != nil || got.Token != secretToken+"c2" {
		t.Fatalf("restored value: %v", err)
	}
}

func TestServiceRefusesToStartWithoutAKey(t *testing.T) {
	j := testkit.StartJetStream(t)
	_, err := clusterimport.New(testkit.Context(t, 10*time.Second), j.JS, clusterimport.Config{}, testkit.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "--credentials-key-file") {
		t.Fatalf("got %v", err)
	}
}

// The whole rotation: values of an old key and plaintext values from before sealing are
// resealed under the new key; the old key can then leave the key file and a restarted service
// reads everything.
func TestRotationReseals(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 90*time.Second)
	keys := keyLines{}
	keyFile := filepath.Join(t.TempDir(), "credentials.key")
	want := map[string]*clusterv1.ConnectionCredentials{"legacy": tokenCreds(secretToken + "-legacy"), "c1": tokenCreds(secretToken), "c2": kubeconfigCreds(), "bare": nil}

	// Before sealing existed: plaintext values (what --insecure-dev still writes).
	old := start(t, j, clusterimport.Config{PlaintextCredentials: true})
	if _, err := old.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "legacy", Credentials: want["legacy"]})); err != nil {
		t.Fatal(err)
	}
	old.stop()

	e := start(t, j, clusterimport.Config{Keyring: keys.write(t, keyFile, "k1")})
	for _, name := range []string{"c1", "c2", "bare"} {
		if _, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name, Credentials: want[name]})); err != nil {
			t.Fatal(err)
		}
	}
	checkAll := func(e *env) {
		t.Helper()
		for name, w := range want {
			got, err := e.svc.Credentials(ctx, name)
			if err != nil || !proto.Equal(got, w) {
				t.Fatalf("credentials of %s: %v", name, err)
			}
		}
	}
	checkAll(e) // the plaintext value is still read
	e.stop()

	// A keyring without the key that sealed a value says which key it needs.
	wrong := keys.write(t, filepath.Join(t.TempDir(), "wrong"), "k9")
	w := start(t, j, clusterimport.Config{Keyring: wrong})
	if _, err := w.svc.Credentials(ctx, "c1"); err == nil || !strings.Contains(err.Error(), `unknown key id "k1"`) {
		t.Fatalf("open with the wrong key file: %v", err)
	}
	w.stop()

	// Rotate: k2 first, k1 still listed.
	ring := keys.write(t, keyFile, "k2", "k1")
	rep, err := clusterimport.Reseal(ctx, j.JS, ring, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Resealed["k1"] != 2 || rep.Resealed[clusterimport.PlaintextKeyID] != 1 || rep.Total() != 3 || rep.Current != 0 || rep.Empty != 1 || rep.ActiveKeyID != "k2" {
		t.Fatalf("report %+v", rep)
	}
	assertNoSecret(t, "report", []byte(rep.String()))
	if !strings.Contains(rep.String(), "resealed 3 credential values under key k2") {
		t.Fatalf("report %q", rep)
	}
	// Again: nothing left to do.
	if rep, err = clusterimport.Reseal(ctx, j.JS, ring, testkit.Logger(t)); err != nil || rep.Total() != 0 || rep.Current != 3 {
		t.Fatalf("second reseal %+v %v", rep, err)
	}
	_, stored := allStreamBytes(t, ctx, j.JS)
	for _, v := range stored {
		sec := &clusterv1.ClusterSecrets{}
		_ = proto.Unmarshal(v, sec)
		if sec.Credentials != nil {
			t.Fatalf("plaintext left after rotation: cluster %s", sec.ClusterName)
		}
		if len(sec.SealedCredentials) > 0 {
			if id, _ := sealed.KeyID(sec.SealedCredentials); id != "k2" {
				t.Fatalf("cluster %s still under key %s", sec.ClusterName, id)
			}
		}
	}

	// The old key leaves the file; a restarted service reads, updates and deregisters.
	e2 := start(t, j, clusterimport.Config{Keyring: keys.write(t, keyFile, "k2")})
	checkAll(e2)
	if _, err := e2.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{
		Name: "c2", Credentials: tokenCreds(secretNewToken), UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credentials"}},
	})); err != nil {
		t.Fatal(err)
	}
	want["c2"] = tokenCreds(secretNewToken)
	if _, err := e2.client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
	delete(want, "c1")
	checkAll(e2)
	e2.stop()

	// Resealing with a key file that lacks the key in use fails, names the key, and changes
	// nothing.
	rep, err = clusterimport.Reseal(ctx, j.JS, wrong, testkit.Logger(t))
	if err == nil || len(rep.Failed) != 2 || !strings.Contains(fmt.Sprint(rep.Failed), `unknown key id "k2"`) || rep.Total() != 0 {
		t.Fatalf("reseal with the wrong key file: %+v %v", rep, err)
	}
	checkAll(start(t, j, clusterimport.Config{Keyring: keys.write(t, keyFile, "k2")}))
}

// Reseal replaces each value with compare-and-set: credentials updated through the API while
// it runs are never overwritten with the resealed old value.
func TestResealDoesNotLoseConcurrentUpdates(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 120*time.Second)
	keys := keyLines{}
	keyFile := filepath.Join(t.TempDir(), "credentials.key")
	e := start(t, j, clusterimport.Config{Keyring: keys.write(t, keyFile, "k1")})
	const n = 15
	for i := range n {
		if _, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: fmt.Sprintf("c%d", i), Credentials: tokenCreds("old")})); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		// As the procedure says: the service runs with the new key file before the reseal.
		ring := keys.write(t, keyFile, fmt.Sprintf("k%d", round+2), fmt.Sprintf("k%d", round+1))
		e.stop()
		e = start(t, j, clusterimport.Config{Keyring: ring})
		var wg sync.WaitGroup
		errs := make(chan error, n+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := clusterimport.Reseal(ctx, j.JS, ring, testkit.Logger(t)); err != nil {
				errs <- err
			}
		}()
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{
					Name: fmt.Sprintf("c%d", i), Credentials: tokenCreds(fmt.Sprintf("new-%d", round)), UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credentials"}},
				})); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for i := range n {
			got, err := e.svc.Credentials(ctx, fmt.Sprintf("c%d", i))
			if err != nil || got.Token != fmt.Sprintf("new-%d", round) {
				t.Fatalf("round %d c%d: %v %v (an update was lost)", round, i, got.GetToken(), err)
			}
		}
		// Everything is under the new key: a second pass has nothing to do.
		if rep, err := clusterimport.Reseal(ctx, j.JS, ring, testkit.Logger(t)); err != nil || rep.Total() != 0 || rep.Current != n {
			t.Fatalf("round %d: second pass %+v %v", round, rep, err)
		}
	}
}

// With the key that sealed them lost, stored credentials do not open, but new ones can be set
// and the cluster deregistered.
func TestLostKeyCredentialsCanBeReplaced(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	e := start(t, j, clusterimport.Config{Keyring: newRing(t, "lost")})
	if _, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c1", Credentials: tokenCreds(secretToken)})); err != nil {
		t.Fatal(err)
	}
	e.stop()
	e = start(t, j, clusterimport.Config{Keyring: newRing(t, "fresh")})
	if _, err := e.svc.Credentials(ctx, "c1"); err == nil || !strings.Contains(err.Error(), `unknown key id "lost"`) {
		t.Fatalf("open with the key lost: %v", err)
	}
	if _, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{
		Name: "c1", Credentials: tokenCreds(secretNewToken), UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credentials"}},
	})); err != nil {
		t.Fatal(err)
	}
	if got, err := e.svc.Credentials(ctx, "c1"); err != nil || got.Token != secretNewToken {
		t.Fatalf("replaced credentials: %v", err)
	}
	// Clearing them leaves nothing sealed behind either.
	if _, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{
		Name: "c1", UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credentials"}},
	})); err != nil {
		t.Fatal(err)
	}
	if got, err := e.svc.Credentials(ctx, "c1"); err != nil || got != nil {
		t.Fatalf("cleared credentials: %v %v", got, err)
	}
	if _, err := e.client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c1"})); err != nil {
		t.Fatal(err)
	}
}
