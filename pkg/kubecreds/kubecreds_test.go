package kubecreds_test

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/kubecreds"
)

var (
	caB64   = base64.StdEncoding.EncodeToString([]byte("CA-PEM"))
	certB64 = base64.StdEncoding.EncodeToString([]byte("CERT-PEM"))
	keyB64  = base64.StdEncoding.EncodeToString([]byte("KEY-PEM"))
)

// kubeconfig is a valid one with cluster and user fields added (YAML flow-mapping entries).
func kubeconfig(clusterExtra, userExtra string) string {
	return `apiVersion: v1
kind: Config
preferences: {}
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443", certificate-authority-data: "` + caB64 + `"` + clusterExtra + `}
users:
- name: u
  user: {token: "t0k"` + userExtra + `}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: default}
current-context: x
`
}

// Every field that reads a file, runs a command, impersonates or detours the traffic is
// refused by its path, as are unknown fields; inline data is accepted.
func TestKubeconfig(t *testing.T) {
	allowProxy := kubecreds.Policy{AllowedProxies: []string{"proxy.internal:3128", "socks.internal"}}
	for _, tc := range []struct {
		name   string
		doc    string
		policy kubecreds.Policy
		field  string // the refused field; empty: accepted
	}{
		{name: "inline token", doc: kubeconfig("", "")},
		{name: "inline client certificate", doc: kubeconfig(`, tls-server-name: "k.internal", disable-compression: true`,
			`, client-certificate-data: "`+certB64+`", client-key-data: "`+keyB64+`"`)},
		{name: "insecure-skip-tls-verify false", doc: kubeconfig(", insecure-skip-tls-verify: false", "")},
		{name: "extensions", doc: kubeconfig(`, extensions: [{name: x, extension: {a: 1}}]`, `, extensions: [{name: y, extension: "z"}]`)},
		{name: "empty plugin fields", doc: kubeconfig(`, certificate-authority: ""`, `, exec: null, tokenFile: "", as-groups: []`)},
		{name: "allowed proxy by host:port", doc: kubeconfig(`, proxy-url: "http://proxy.internal:3128"`, ""), policy: allowProxy},
		{name: "allowed proxy by host", doc: kubeconfig(`, proxy-url: "socks5://SOCKS.internal:1080"`, ""), policy: allowProxy},

		{name: "exec", doc: kubeconfig("", `, exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, "touch /tmp/x"]}`), field: "users[0].user.exec"},
		{name: "auth-provider", doc: kubeconfig("", `, auth-provider: {name: gcp, config: {cmd-path: /bin/sh}}`), field: "users[0].user.auth-provider"},
		{name: "tokenFile", doc: kubeconfig("", `, tokenFile: /etc/shadow`), field: "users[0].user.tokenFile"},
		{name: "client-certificate", doc: kubeconfig("", `, client-certificate: /hub/cert`), field: "users[0].user.client-certificate"},
		{name: "client-key", doc: kubeconfig("", `, client-key: /hub/key`), field: "users[0].user.client-key"},
		{name: "certificate-authority", doc: kubeconfig(`, certificate-authority: /hub/ca`, ""), field: "clusters[0].cluster.certificate-authority"},
		{name: "as", doc: kubeconfig("", `, as: system:admin`), field: "users[0].user.as"},
		{name: "as-groups", doc: kubeconfig("", `, as-groups: [system:masters]`), field: "users[0].user.as-groups"},
		{name: "as-uid", doc: kubeconfig("", `, as-uid: "0"`), field: "users[0].user.as-uid"},
		{name: "as-user-extra", doc: kubeconfig("", `, as-user-extra: {a: [b]}`), field: "users[0].user.as-user-extra"},
		{name: "password", doc: kubeconfig("", `, username: admin, password: pw`), field: "users[0].user.password"},
		{name: "insecure-skip-tls-verify", doc: kubeconfig(", insecure-skip-tls-verify: true", ""), field: "clusters[0].cluster.insecure-skip-tls-verify"},
		{name: "proxy not allowed (empty list)", doc: kubeconfig(`, proxy-url: "http://proxy.internal:3128"`, ""), field: "clusters[0].cluster.proxy-url"},
		{name: "proxy on another port", doc: kubeconfig(`, proxy-url: "http://proxy.internal:8080"`, ""), policy: allowProxy, field: "clusters[0].cluster.proxy-url"},
		{name: "proxy on another host", doc: kubeconfig(`, proxy-url: "http://evil.example:3128"`, ""), policy: allowProxy, field: "clusters[0].cluster.proxy-url"},
		{name: "unknown user field", doc: kubeconfig("", `, Exec: {command: /bin/sh}`), field: "users[0].user.Exec"},
		{name: "unknown cluster field", doc: kubeconfig(`, future-file: /x`, ""), field: "clusters[0].cluster.future-file"},
		{name: "unknown top-level field", doc: kubeconfig("", "") + "plugins: {a: b}\n", field: "plugins"},
		{name: "http server", doc: strings.Replace(kubeconfig("", ""), "https://", "http://", 1), field: "clusters[0].cluster.server"},
		{name: "server with user info", doc: strings.Replace(kubeconfig("", ""), "https://", "https://a:b@", 1), field: "clusters[0].cluster.server"},
		{name: "no credentials", doc: strings.Replace(kubeconfig("", ""), `token: "t0k"`, `token: ""`, 1), field: "users[0].user"},
		{name: "certificate without key", doc: kubeconfig("", `, client-certificate-data: "`+certB64+`"`), field: "users[0].user.client-key-data"},
		{name: "bad base64", doc: kubeconfig(`, tls-server-name: x`, `, client-key-data: "%%%"`), field: "users[0].user.client-key-data"},
		{name: "current context missing", doc: strings.Replace(kubeconfig("", ""), "current-context: x", "current-context: y", 1), field: "current-context"},
		{name: "not YAML", doc: "{{{", field: "kubeconfig"},
		{name: "not a mapping", doc: "- a\n", field: "kubeconfig"},
		{name: "empty", doc: "", field: "kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kubecreds.Kubeconfig([]byte(tc.doc), tc.policy)
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.Server != "https://10.0.0.1:6443" || string(c.CAData) != "CA-PEM" {
					t.Errorf("credentials %+v", c)
				}
				return
			}
			var ke *kubecreds.Error
			if !errors.As(err, &ke) || !kubecreds.IsRefused(err) {
				t.Fatalf("want a refusal of %s, got %v", tc.field, err)
			}
			if tc.field == "kubeconfig" {
				if ke.Fields[0].Field != "" || !strings.Contains(err.Error(), "not a valid kubeconfig") {
					t.Errorf("want a parse error, got %v", err)
				}
				return
			}
			found := false
			for _, f := range ke.Fields {
				found = found || f.Field == tc.field
			}
			if !found {
				t.Errorf("want field %s named, got %v", tc.field, err)
			}
			for _, secret := range []string{"t0k", "/etc/shadow", "touch", "pw"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error quotes %q: %v", secret, err)
				}
			}
		})
	}
}

// Every entry is checked, not only the current context's, and an entry's duplicate name is
// refused (which one client-go would use must not be a guess).
func TestKubeconfigChecksEveryEntry(t *testing.T) {
	doc := kubeconfig("", "") + `
`
	doc = strings.Replace(doc, "contexts:", `- name: other
  user: {exec: {command: /bin/sh}}
- name: u
  user: {token: "again"}
contexts:`, 1)
	_, err := kubecreds.Kubeconfig([]byte(doc), kubecreds.Policy{})
	if err == nil || !strings.Contains(err.Error(), "users[1].user.exec") || !strings.Contains(err.Error(), "users[2].name: duplicate name") {
		t.Fatalf("want users[1].user.exec and users[2].name refused, got %v", err)
	}
}

// The client configuration carries the inline data and nothing that runs, reads or redirects.
func TestRESTConfig(t *testing.T) {
	c, err := kubecreds.Kubeconfig([]byte(kubeconfig(`, tls-server-name: "k.internal", proxy-url: "http://proxy.internal:3128"`,
		`, client-certificate-data: "`+certB64+`", client-key-data: "`+keyB64+`"`)), kubecreds.Policy{AllowedProxies: []string{"proxy.internal"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.RESTConfig()
	if cfg.Host != "https://10.0.0.1:6443" || cfg.BearerToken != "t0k" || string(cfg.CAData) != "CA-PEM" ||
		string(cfg.CertData) != "CERT-PEM" || string(cfg.KeyData) != "KEY-PEM" || cfg.ServerName != "k.internal" {
		t.Errorf("config %+v", cfg)
	}
	if cfg.ExecProvider != nil || cfg.AuthProvider != nil || cfg.BearerTokenFile != "" || cfg.CAFile != "" ||
		cfg.CertFile != "" || cfg.KeyFile != "" || cfg.Impersonate.UserName != "" || cfg.Username != "" || cfg.Insecure {
		t.Errorf("config holds more than inline data: %+v", cfg)
	}
	req, _ := http.NewRequest(http.MethodGet, "https://10.0.0.1:6443/api", nil)
	if u, err := cfg.Proxy(req); err != nil || u.String() != "http://proxy.internal:3128" {
		t.Errorf("proxy %v, %v", u, err)
	}
}

// Inline connection credentials are checked like a kubeconfig's.
func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		name  string
		creds *clusterv1.ConnectionCredentials
		field string
	}{
		{name: "token", creds: &clusterv1.ConnectionCredentials{Server: "https://k:6443", Token: "t"}},
		{name: "client certificate", creds: &clusterv1.ConnectionCredentials{Server: "https://k:6443", ClientCertificateData: []byte("c"), ClientKeyData: []byte("k")}},
		{name: "kubeconfig", creds: &clusterv1.ConnectionCredentials{Kubeconfig: []byte(kubeconfig("", ""))}},
		{name: "kubeconfig with exec", creds: &clusterv1.ConnectionCredentials{Kubeconfig: []byte(kubeconfig("", ", exec: {command: x}"))}, field: "users[0].user.exec"},
		{name: "no server", creds: &clusterv1.ConnectionCredentials{Token: "t"}, field: "server"},
		{name: "http server", creds: &clusterv1.ConnectionCredentials{Server: "http://k", Token: "t"}, field: "server"},
		{name: "no token", creds: &clusterv1.ConnectionCredentials{Server: "https://k"}, field: "token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kubecreds.Load(tc.creds, kubecreds.Policy{})
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.RESTConfig().Host == "" {
					t.Error("no host")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("want %s refused, got %v", tc.field, err)
			}
		})
	}
}

// Kubeconfigs as client-go writes them (kubectl, kind, the test kit, devcluster) are accepted.
func TestKubeconfigWrittenByClientGo(t *testing.T) {
	data, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"kind-a": {Server: "https://127.0.0.1:6443", CertificateAuthorityData: []byte("CA-PEM"), TLSServerName: "a"}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"kind-a": {ClientCertificateData: []byte("CERT-PEM"), ClientKeyData: []byte("KEY-PEM")}},
		Contexts:       map[string]*clientcmdapi.Context{"kind-a": {Cluster: "kind-a", AuthInfo: "kind-a", Namespace: "default"}},
		CurrentContext: "kind-a",
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubecreds.Kubeconfig(data, kubecreds.Policy{})
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if c.Server != "https://127.0.0.1:6443" || string(c.CertData) != "CERT-PEM" || string(c.KeyData) != "KEY-PEM" {
		t.Errorf("credentials %+v", c)
	}
}
