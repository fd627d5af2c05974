package hosted_test

import (
	"strings"
	"testing"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/kubecreds"
	"github.com/fleetstream/fleetstream/services/cluster-agent/hosted"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443", certificate-authority-data: "Y2E="}
users:
- name: u
  user: {token: "t0k"}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

// Stored credentials become the client configuration a hosted agent connects with.
func TestRESTConfig(t *testing.T) {
	for _, tc := range []struct {
		name              string
		creds             *clusterv1.ConnectionCredentials
		host, token, ca   string
		cert, key, errSub string
	}{
		{name: "kubeconfig's current context", creds: &clusterv1.ConnectionCredentials{Kubeconfig: []byte(kubeconfig)},
			host: "https://10.0.0.1:6443", token: "t0k", ca: "ca"},
		{name: "server, CA and token", creds: &clusterv1.ConnectionCredentials{Server: "https://k:6443", CertificateAuthorityData: []byte("ca2"), Token: "tt"},
			host: "https://k:6443", token: "tt", ca: "ca2"},
		{name: "client certificate", creds: &clusterv1.ConnectionCredentials{Server: "https://k:6443", ClientCertificateData: []byte("crt"), ClientKeyData: []byte("key")},
			host: "https://k:6443", cert: "crt", key: "key"},
		{name: "nothing to connect with", creds: &clusterv1.ConnectionCredentials{Token: "orphan"}, errSub: "server"},
		{name: "exec plugin", creds: &clusterv1.ConnectionCredentials{Kubeconfig: []byte(strings.Replace(kubeconfig, `{token: "t0k"}`, `{exec: {command: /bin/sh}}`, 1))},
			errSub: "users[0].user.exec"},
		{name: "token file", creds: &clusterv1.ConnectionCredentials{Kubeconfig: []byte(strings.Replace(kubeconfig, `{token: "t0k"}`, `{tokenFile: /etc/hostname}`, 1))},
			errSub: "users[0].user.tokenFile"},
		{name: "broken kubeconfig", creds: &clusterv1.ConnectionCredentials{Kubeconfig: []byte("{")}, errSub: "kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := hosted.RESTConfig(tc.creds, kubecreds.Policy{})
			if tc.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errSub) {
					t.Fatalf("want an error about %q, got %v", tc.errSub, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tc.host || cfg.BearerToken != tc.token || string(cfg.CAData) != tc.ca ||
				string(cfg.CertData) != tc.cert || string(cfg.KeyData) != tc.key {
				t.Errorf("config %s token %q ca %q cert %q key %q", cfg.Host, cfg.BearerToken, cfg.CAData, cfg.CertData, cfg.KeyData)
			}
		})
	}
}
