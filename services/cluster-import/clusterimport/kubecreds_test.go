package clusterimport_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/kubecreds"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// kubeconfigWith is kubeconfigFor(server, "inline-token") with cluster and user fields added
// (YAML flow-mapping entries, each starting with ", ").
func kubeconfigWith(server, clusterExtra, userExtra string) string {
	return strings.Replace(strings.Replace(kubeconfigFor(server, "inline-token"),
		"{server: "+server+"}", "{server: "+server+clusterExtra+"}", 1),
		"{token: inline-token}", "{token: inline-token"+userExtra+"}", 1)
}

// A kubeconfig that would run a command or read a file on the hub, impersonate, or detour its
// traffic through a proxy is refused by RegisterCluster and UpdateCluster with the field
// named, and nothing of it is stored or run. The exec plugin would create a marker file and
// the token file holds a secret the test server would receive: neither happens.
func TestCredentialsThatAreNotInlineDataAreRefusedWhenWritten(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, "no", http.StatusUnauthorized)
	}))
	defer srv.Close()
	dir := t.TempDir()
	marker := filepath.Join(dir, "exec-ran")
	secretFile := filepath.Join(dir, "hub-secret")
	if err := os.WriteFile(secretFile, []byte("hub-secret-8d1f"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := start(t, nil, clusterimport.Config{Credentials: kubecreds.Policy{AllowedProxies: []string{"proxy.fleet.internal"}}})
	ctx := testkit.Context(t, 60*time.Second)
	s := srv.URL
	if _, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "victim",
		Credentials: &clusterv1.ConnectionCredentials{Kubeconfig: []byte(kubeconfigWith(s, "", ""))}})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, kubeconfig, field string }{
		{"exec", kubeconfigWith(s, "", `, exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, "touch `+marker+`"]}`), "users[0].user.exec"},
		{"auth-provider", kubeconfigWith(s, "", `, auth-provider: {name: oidc, config: {idp-issuer-url: "`+s+`"}}`), "users[0].user.auth-provider"},
		{"tokenFile", kubeconfigWith(s, "", ", tokenFile: "+secretFile), "users[0].user.tokenFile"},
		{"client-certificate", kubeconfigWith(s, "", ", client-certificate: "+secretFile), "users[0].user.client-certificate"},
		{"client-key", kubeconfigWith(s, "", ", client-key: "+secretFile), "users[0].user.client-key"},
		{"certificate-authority", kubeconfigWith(s, ", certificate-authority: "+secretFile, ""), "clusters[0].cluster.certificate-authority"},
		{"impersonation", kubeconfigWith(s, "", ", as: system:admin, as-groups: [system:masters]"), "users[0].user.as"},
		{"proxy-url to a host not allowed", kubeconfigWith(s, ", proxy-url: http://attacker.example:3128", ""), "clusters[0].cluster.proxy-url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			creds := &clusterv1.ConnectionCredentials{Kubeconfig: []byte(tc.kubeconfig)}
			_, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "attack", Credentials: creds}))
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "credentials.kubeconfig."+tc.field+":") {
				t.Fatalf("register: got %v, want InvalidArgument naming credentials.kubeconfig.%s", err, tc.field)
			}
			if strings.Contains(err.Error(), secretFile) || strings.Contains(err.Error(), marker) {
				t.Errorf("the error quotes the kubeconfig: %v", err)
			}
			_, err = e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "victim", Credentials: creds,
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credentials"}}}))
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "credentials.kubeconfig."+tc.field+":") {
				t.Fatalf("update: got %v, want InvalidArgument naming credentials.kubeconfig.%s", err, tc.field)
			}
		})
	}
	// Nothing was written: the victim keeps its inline credentials, no cluster "attack" exists.
	if got, err := e.svc.Credentials(ctx, "victim"); err != nil || string(got.GetKubeconfig()) != kubeconfigWith(s, "", "") {
		t.Fatalf("victim's credentials changed: %v", err)
	}
	if _, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "attack"})); code(err) != connect.CodeNotFound {
		t.Fatalf("a refused registration left a cluster: %v", err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the exec plugin ran: %v", err)
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("the test server was called %d times", n)
	}
	// A proxy the operator listed is accepted.
	if _, err := e.client.UpdateCluster(ctx, connect.NewRequest(&clusterv1.UpdateClusterRequest{Name: "victim",
		Credentials: &clusterv1.ConnectionCredentials{Kubeconfig: []byte(kubeconfigWith(s, ", proxy-url: http://proxy.fleet.internal:3128", ""))},
		UpdateMask:  &fieldmaskpb.FieldMask{Paths: []string{"credentials"}}})); err != nil {
		t.Fatal(err)
	}
}

// An import policy whose Secret (tenant-writable on the inventory cluster) holds a kubeconfig
// with an exec plugin or a token file creates no cluster: the lifecycle's Rendered condition
// names the field, like any other render error.
func TestImportRenderRefusesKubeconfigThatIsNotInlineData(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, clusterimport.Config{})
	ctx := testkit.Context(t, 60*time.Second)
	pc := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	register(t, e, "mgmt", nil)
	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: lifecyclePolicy()})); err != nil {
		t.Fatal(err)
	}
	inv := &fakeInventory{t: t, j: j, store: events.NewStore(j.JS, "system:cluster-agent:mgmt"), cluster: "mgmt"}
	bad := map[string]string{
		"alpha": kubeconfigWith("https://alpha.example:6443", "", ", exec: {command: /bin/sh, args: [-c, 'touch /tmp/pwned']}"),
		"beta":  kubeconfigWith("https://beta.example:6443", "", ", tokenFile: /data/credentials.key"),
	}
	field := map[string]string{"alpha": "users[0].user.exec", "beta": "users[0].user.tokenFile"}
	for name, kc := range bad {
		inv.source(name, true, nil, nil)
		inv.secret(name+"-kubeconfig", kc)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		res, err := pc.ListImportLifecycles(ctx, connect.NewRequest(&clusterv1.ListImportLifecyclesRequest{Policy: "capi"}))
		if err != nil {
			return err
		}
		if len(res.Msg.Lifecycles) != 2 {
			return fmt.Errorf("%d lifecycles", len(res.Msg.Lifecycles))
		}
		for _, lc := range res.Msg.Lifecycles {
			var rendered *clusterv1.Condition
			for _, c := range lc.Conditions {
				if c.Type == "Rendered" {
					rendered = c
				}
			}
			want := "credentials.kubeconfig." + field[lc.Source.Name]
			if rendered == nil || rendered.Reason != "InvalidCluster" || !strings.Contains(rendered.Message, want) {
				return fmt.Errorf("%s: rendered %v, want InvalidCluster naming %s", lc.Source.Name, rendered, want)
			}
			if lc.Cluster != "" {
				return fmt.Errorf("%s: created cluster %s", lc.Source.Name, lc.Cluster)
			}
		}
		return nil
	})
	for name := range bad {
		if _, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: name})); code(err) != connect.CodeNotFound {
			t.Errorf("cluster %s: %v", name, err)
		}
	}
}
