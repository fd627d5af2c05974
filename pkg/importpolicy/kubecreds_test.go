package importpolicy

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/kubecreds"
)

// A Secret a tenant can write renders a kubeconfig that would run a command, read a hub file
// or detour through a proxy: the render fails, the field named, and no cluster can be created
// from it. A proxy the operator allows renders.
func TestRenderRefusesKubeconfigThatIsNotInlineData(t *testing.T) {
	withUser := func(extra string) string {
		return strings.Replace(capiKubeconfig, "    token: "+capiToken+"\n", "    token: "+capiToken+"\n"+extra, 1)
	}
	withCluster := func(extra string) string {
		return strings.Replace(capiKubeconfig, "    server: https://10.0.0.1:6443\n", "    server: https://10.0.0.1:6443\n"+extra, 1)
	}
	allow := kubecreds.Policy{AllowedProxies: []string{"proxy.fleet.internal"}}
	for _, tc := range []struct {
		name, kubeconfig string
		policy           kubecreds.Policy
		field            string // empty: renders
	}{
		{name: "exec", kubeconfig: withUser("    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'touch /tmp/pwned']}\n"),
			field: "credentials.kubeconfig.users[0].user.exec"},
		{name: "auth-provider", kubeconfig: withUser("    auth-provider: {name: oidc}\n"), field: "credentials.kubeconfig.users[0].user.auth-provider"},
		{name: "tokenFile", kubeconfig: withUser("    tokenFile: /data/credentials.key\n"), field: "credentials.kubeconfig.users[0].user.tokenFile"},
		{name: "client-key", kubeconfig: withUser("    client-key: /data/credentials.key\n"), field: "credentials.kubeconfig.users[0].user.client-key"},
		{name: "certificate-authority", kubeconfig: withCluster("    certificate-authority: /etc/ssl/private/hub.pem\n"),
			field: "credentials.kubeconfig.clusters[0].cluster.certificate-authority"},
		{name: "proxy-url", kubeconfig: withCluster("    proxy-url: http://attacker.example:8080\n"), policy: allow,
			field: "credentials.kubeconfig.clusters[0].cluster.proxy-url"},
		{name: "allowed proxy-url", kubeconfig: withCluster("    proxy-url: http://proxy.fleet.internal:3128\n"), policy: allow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := NewEngine(Limits{}).WithCredentialsPolicy(tc.policy)
			p := capiPolicy()
			c, errs := e.Compile(&p)
			if errs != nil {
				t.Fatal(errs)
			}
			secret := strings.Replace(capiSecret("prod-eu"), capiKubeconfigB64, base64.StdEncoding.EncodeToString([]byte(tc.kubeconfig)), 1)
			res := e.Render(context.Background(), c, []byte(capiCluster("prod-eu", true)), FetcherFunc(func(context.Context, Target) ([]byte, error) {
				return []byte(secret), nil
			}))
			if tc.field == "" {
				if !res.CanCreate() {
					t.Fatalf("refused:\n%s", errFields(res.Errors))
				}
				return
			}
			if res.CanCreate() {
				t.Fatal("a cluster can be created from it")
			}
			found := false
			for _, fe := range res.Errors {
				found = found || (fe.Field == "template: "+tc.field && fe.Reason == ReasonInvalidCluster)
				if strings.Contains(fe.Message, "/data/") || strings.Contains(fe.Message, "touch") || strings.Contains(fe.Message, capiToken) {
					t.Errorf("message quotes the kubeconfig: %s", fe.Message)
				}
			}
			if !found {
				t.Fatalf("want %s refused, got:\n%s", tc.field, errFields(res.Errors))
			}
			if r := res.Conditions[2]; r.Type != ConditionRendered || r.Status != "False" || !strings.Contains(r.Message, tc.field) {
				t.Errorf("rendered condition %+v", r)
			}
		})
	}
}
