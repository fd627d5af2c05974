package importpolicy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/Masterminds/sprig/v3"
)

// A Cluster API kubeconfig Secret's value. The token and CA are chosen so their base64 holds
// '+' and '/', which html/template (Clusterpedia's choice) would escape.
const capiToken = "eyJhbGciOiJSUzI1NiJ9.capi-admin-token+/secret-value"

var capiKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: prod-eu
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: ` + base64.StdEncoding.EncodeToString([]byte("-----BEGIN CERTIFICATE-----\n\xfb\xff\xfe CA bytes\n-----END CERTIFICATE-----")) + `
contexts:
- name: prod-eu-admin@prod-eu
  context:
    cluster: prod-eu
    user: prod-eu-admin
current-context: prod-eu-admin@prod-eu
users:
- name: prod-eu-admin
  user:
    token: ` + capiToken + "\n"

var capiKubeconfigB64 = base64.StdEncoding.EncodeToString([]byte(capiKubeconfig))

func capiCluster(name string, ready bool) string {
	status := "False"
	if ready {
		status = "True"
	}
	return `{"apiVersion":"cluster.x-k8s.io/v1beta1","kind":"Cluster",
	"metadata":{"name":"` + name + `","namespace":"fleet","labels":{"topology.kubernetes.io/region":"eu-west-1","env":"prod"}},
	"spec":{"controlPlaneEndpoint":{"host":"10.0.0.1","port":6443},"replicas":3},
	"status":{"phase":"Provisioned","conditions":[{"type":"InfrastructureReady","status":"True"},{"type":"Ready","status":"` + status + `"}]}}`
}

func capiSecret(name string) string {
	return `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"` + name + `-kubeconfig","namespace":"fleet"},
	"type":"cluster.x-k8s.io/secret","data":{"value":"` + capiKubeconfigB64 + `"}}`
}

func capiPolicy() ImportPolicy {
	return ImportPolicy{
		Name:   "capi",
		Source: Source{Cluster: "mgmt", Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters"},
		References: []Reference{{
			Key: "kubeconfig", Group: "", Version: "v1", Resource: "secrets",
			NamespaceTemplate: "{{ .source.metadata.namespace }}",
			NameTemplate:      "{{ .source.metadata.name }}-kubeconfig",
		}},
		NameTemplate: "capi-{{ .source.metadata.name }}\n",
		Template: `labels:
  provider: capi
  env: "{{ .source.metadata.labels.env }}"
claims:
  region: "{{ index .source.metadata.labels "topology.kubernetes.io/region" }}"
  replicas: "{{ if eq .source.spec.replicas 3 }}three{{ end }}"
credentials:
  kubeconfig: "{{ .references.kubeconfig.data.value }}"
`,
		CreationCondition: `{{ range .source.status.conditions }}{{ if and (eq .type "Ready") (eq .status "True") }}true{{ end }}{{ end }}`,
	}
}

const karmadaCA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUMrL2thcm1hZGEgQ0EKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="
const karmadaToken = "karmada-member-sa-token-0123456789"

func karmadaCluster(name, mode string) string {
	return `{"apiVersion":"cluster.karmada.io/v1alpha1","kind":"Cluster","metadata":{"name":"` + name + `"},
	"spec":{"apiEndpoint":"https://member1.example.com:6443","syncMode":"` + mode + `","provider":"aws","region":"us-east-1",
	"secretRef":{"namespace":"karmada-cluster","name":"` + name + `"},
	"taints":[{"key":"maintenance","value":"planned","effect":"NoSchedule"}]}}`
}

func karmadaSecret(name string) string {
	return `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"` + name + `","namespace":"karmada-cluster"},
	"data":{"caBundle":"` + karmadaCA + `","token":"` + base64.StdEncoding.EncodeToString([]byte(karmadaToken)) + `"}}`
}

func karmadaPolicy() ImportPolicy {
	return ImportPolicy{
		Name:   "karmada",
		Source: Source{Cluster: "karmada-host", Group: "cluster.karmada.io", Resource: "clusters"},
		References: []Reference{{
			Key: "secret", Resource: "secrets",
			NamespaceTemplate: "{{ .source.spec.secretRef.namespace }}",
			NameTemplate:      "{{ .source.spec.secretRef.name }}",
		}},
		NameTemplate: "karmada-{{ .source.metadata.name }}",
		Template: `labels:
  karmada.io/sync-mode: "{{ .source.spec.syncMode | lower }}"
claims:
  provider: "{{ .source.spec.provider }}"
  region: "{{ .source.spec.region }}"
taints:
{{- range .source.spec.taints }}
- key: "{{ .key }}"
  value: "{{ .value }}"
  effect: NoSelectIfNew
{{- end }}
credentials:
  server: "{{ .source.spec.apiEndpoint }}"
  certificateAuthorityData: "{{ .references.secret.data.caBundle }}"
  token: "{{ .references.secret.data.token | b64dec }}"
`,
		CreationCondition: `{{ if ne .source.spec.apiEndpoint "" }}{{ eq .source.spec.syncMode "Push" }}{{ end }}`,
	}
}

func refs(kv ...string) map[string][]byte {
	m := map[string][]byte{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = []byte(kv[i+1])
	}
	return m
}

// assertNoSecret fails when the preview, marshalled as the API would, holds any secret.
func assertNoSecret(t *testing.T, p *Preview, secrets ...string) {
	t.Helper()
	js, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		if strings.Contains(string(js), s) {
			t.Fatalf("preview holds secret %q:\n%s", s, js)
		}
	}
}

var allSecrets = []string{capiToken, capiKubeconfigB64, capiKubeconfig, karmadaCA, karmadaToken,
	base64.StdEncoding.EncodeToString([]byte(karmadaToken)), capiKubeconfigB64[:40], capiToken[:20]}

func errFields(es FieldErrors) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, e.Field+" ["+e.Reason+"] "+e.Message)
	}
	return strings.Join(parts, "\n")
}

func TestClusterpediaExamples(t *testing.T) {
	e := NewEngine(Limits{})
	ctx := context.Background()

	t.Run("cluster API cluster with its kubeconfig secret", func(t *testing.T) {
		p := capiPolicy()
		pv := e.Preview(ctx, &p, []byte(capiCluster("prod-eu", true)), refs("kubeconfig", capiSecret("prod-eu")))
		if len(pv.Errors) > 0 {
			t.Fatalf("errors:\n%s", errFields(pv.Errors))
		}
		if pv.Name != "capi-prod-eu" || !pv.Create {
			t.Fatalf("name %q create %v", pv.Name, pv.Create)
		}
		c := pv.Cluster
		if c == nil || c.Labels["provider"] != "capi" || c.Labels["env"] != "prod" || c.Claims["region"] != "eu-west-1" || c.Claims["replicas"] != "three" {
			t.Fatalf("cluster %+v", c)
		}
		if c.Server != "https://10.0.0.1:6443" || !c.CredentialsRendered {
			t.Fatalf("server %q credentials %v", c.Server, c.CredentialsRendered)
		}
		if len(pv.References) != 1 || pv.References[0].Namespace != "fleet" || pv.References[0].Name != "prod-eu-kubeconfig" || pv.References[0].Version != "v1" {
			t.Fatalf("references %+v", pv.References)
		}
		for _, cd := range pv.Conditions {
			if cd.Status != "True" {
				t.Fatalf("condition %+v", cd)
			}
		}
		assertNoSecret(t, pv, allSecrets...)

		// The full result, for the lifecycle, holds the kubeconfig byte for byte: base64
		// '+' and '/' survive.
		c2, errs := e.Compile(&p)
		if errs != nil {
			t.Fatal(errs)
		}
		res := e.Render(ctx, c2, []byte(capiCluster("prod-eu", true)), FetcherFunc(func(_ context.Context, tg Target) ([]byte, error) {
			return []byte(capiSecret("prod-eu")), nil
		}))
		if res.Cluster == nil || string(res.Cluster.Credentials.Kubeconfig) != capiKubeconfig {
			t.Fatalf("kubeconfig did not survive: %+v", res.Errors)
		}
		if !res.CanCreate() {
			t.Fatalf("cannot create: %+v", res)
		}
		res = e.Render(ctx, c2, []byte(capiCluster("prod-eu", true)), nil)
		if res.CanCreate() || res.Create {
			t.Fatalf("creatable without its reference: %+v", res)
		}
	})

	t.Run("cluster API cluster not ready yet", func(t *testing.T) {
		p := capiPolicy()
		pv := e.Preview(ctx, &p, []byte(capiCluster("prod-us", false)), refs("kubeconfig", capiSecret("prod-us")))
		if len(pv.Errors) > 0 || pv.Create || pv.Name != "capi-prod-us" || pv.Cluster == nil {
			t.Fatalf("preview %+v errors %s", pv, errFields(pv.Errors))
		}
		if r := pv.Conditions[2]; r.Status != "True" || !strings.Contains(r.Message, "creation condition") {
			t.Fatalf("rendered condition %+v", r)
		}
	})

	t.Run("karmada push cluster", func(t *testing.T) {
		p := karmadaPolicy()
		pv := e.Preview(ctx, &p, []byte(karmadaCluster("member1", "Push")), refs("secret", karmadaSecret("member1")))
		if len(pv.Errors) > 0 {
			t.Fatalf("errors:\n%s", errFields(pv.Errors))
		}
		c := pv.Cluster
		if pv.Name != "karmada-member1" || !pv.Create || c.Labels["karmada.io/sync-mode"] != "push" || c.Claims["provider"] != "aws" {
			t.Fatalf("preview %+v cluster %+v", pv, c)
		}
		if len(c.Taints) != 1 || c.Taints[0].Effect != "TAINT_EFFECT_NO_SELECT_IF_NEW" || c.Taints[0].Key != "maintenance" {
			t.Fatalf("taints %+v", c.Taints)
		}
		if c.Server != "https://member1.example.com:6443" || !c.CredentialsRendered {
			t.Fatalf("cluster %+v", c)
		}
		assertNoSecret(t, pv, allSecrets...)
	})

	t.Run("karmada pull cluster is not created", func(t *testing.T) {
		p := karmadaPolicy()
		pv := e.Preview(ctx, &p, []byte(karmadaCluster("member2", "Pull")), refs("secret", karmadaSecret("member2")))
		if len(pv.Errors) > 0 || pv.Create {
			t.Fatalf("preview %+v errors %s", pv, errFields(pv.Errors))
		}
	})
}

func TestCreationCondition(t *testing.T) {
	e := NewEngine(Limits{})
	for _, tc := range []struct {
		cond string
		want bool
	}{
		{"true", true},
		{"  TRUE \n", true},
		{"{{ true }}", true},
		{"True", true},
		{"{{ .source.missing }}", false}, // "<no value>" is empty: false
		// A field of something missing is empty too (import-policies.md), as in Clusterpedia.
		{"{{ .source.spec.missing.deeper }}", false},
		{"{{ if .source.spec.missing.deeper }}{{ else }}true{{ end }}", true},
		{"{{ if false }}true{{ end }}", false},
		{"false", false},
		{"yes", false},
		{"1", false},
		{"{{ eq .source.metadata.name \"src\" }}", true},
	} {
		p := ImportPolicy{Name: "p", Source: Source{Cluster: "c", Resource: "things"}, NameTemplate: "x", Template: "{}", CreationCondition: tc.cond}
		pv := e.Preview(context.Background(), &p, []byte(`{"metadata":{"name":"src"}}`), nil)
		if len(pv.Errors) > 0 || pv.Create != tc.want {
			t.Errorf("%q: create %v, want %v; errors %s", tc.cond, pv.Create, tc.want, errFields(pv.Errors))
		}
	}
}

func TestReferenceOrder(t *testing.T) {
	e := NewEngine(Limits{})
	ref := func(key, ns, name string) Reference {
		return Reference{Key: key, Group: "example.io", Resource: "things", NamespaceTemplate: ns, NameTemplate: name}
	}
	base := func(rs ...Reference) *ImportPolicy {
		return &ImportPolicy{Name: "p", Source: Source{Cluster: "c", Group: "example.io", Resource: "sources"}, References: rs,
			NameTemplate: "{{ .source.metadata.name }}", Template: "{}", CreationCondition: "true"}
	}
	for _, tc := range []struct {
		name      string
		policy    *ImportPolicy
		order     []int
		errField  string
		errSubstr string
	}{
		{"written order", base(ref("a", "", "{{ .source.spec.a }}"), ref("b", "{{ .references.a.spec.ns }}", "{{ .references.a.spec.b }}")), []int{0, 1}, "", ""},
		{"later first", base(ref("b", "", "{{ .references.a.spec.b }}"), ref("a", "", "{{ .source.spec.a }}")), []int{1, 0}, "", ""},
		{"index form", base(ref("b", "", `{{ index .references "a" "spec" "b" }}`), ref("a", "", "x")), []int{1, 0}, "", ""},
		{"chain of three", base(ref("c", "", "{{ .references.b.x }}"), ref("b", "", "{{ $.references.a.x }}"), ref("a", "", "a")), []int{2, 1, 0}, "", ""},
		{"cycle", base(ref("a", "", "{{ .references.b.x }}"), ref("b", "", "{{ .references.a.x }}")), nil, "references[0]", "cycle: a → b → a"},
		{"self", base(ref("a", "", "{{ .references.a.x }}")), nil, "references[0].name_template", "cannot read itself"},
		{"unknown key", base(ref("a", "", "x"), ref("b", "{{ .references.nope.x }}", "x")), nil, "references[1].namespace_template", "no reference has key"},
		{"whole map", base(ref("a", "", "{{ range .references }}x{{ end }}")), nil, "references[0].name_template", "as a whole"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, errs := e.Compile(tc.policy)
			if tc.errField == "" {
				if errs != nil {
					t.Fatalf("errors: %s", errFields(errs))
				}
				if len(c.Order) != len(tc.order) {
					t.Fatalf("order %v want %v", c.Order, tc.order)
				}
				for i := range tc.order {
					if c.Order[i] != tc.order[i] {
						t.Fatalf("order %v want %v", c.Order, tc.order)
					}
				}
				return
			}
			if len(errs) == 0 || errs[0].Field != tc.errField || !strings.Contains(errs[0].Message, tc.errSubstr) {
				t.Fatalf("errors %s, want %s: …%s…", errFields(errs), tc.errField, tc.errSubstr)
			}
		})
	}

	// Resolution follows the order and later references see earlier ones.
	p := base(ref("b", "{{ .references.a.spec.ns }}", "{{ .references.a.spec.b }}"), ref("a", "", "{{ .source.spec.a }}"))
	var asked []string
	c, _ := e.Compile(p)
	res := e.Render(context.Background(), c, []byte(`{"metadata":{"name":"s"},"spec":{"a":"first"}}`), FetcherFunc(func(_ context.Context, tg Target) ([]byte, error) {
		asked = append(asked, tg.String())
		if tg.Key == "a" {
			return []byte(`{"metadata":{"name":"first"},"spec":{"ns":"team","b":"second"}}`), nil
		}
		return []byte(`{"metadata":{"name":"second","namespace":"team"}}`), nil
	}))
	if len(res.Errors) > 0 || strings.Join(asked, ",") != "things.example.io first,things.example.io team/second" {
		t.Fatalf("asked %v errors %s", asked, errFields(res.Errors))
	}
}

func TestMissingReferences(t *testing.T) {
	e := NewEngine(Limits{})
	p := capiPolicy()
	for _, tc := range []struct {
		name   string
		refs   map[string][]byte
		reason string
		substr string
	}{
		{"not supplied", nil, ReasonReferenceNotFound, "secrets fleet/prod-eu-kubeconfig: not supplied"},
		{"another object", refs("kubeconfig", capiSecret("other")), ReasonReferenceInvalid, "not the one the templates resolve"},
		{"not an object", refs("kubeconfig", `[1]`), ReasonReferenceInvalid, "not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pv := e.Preview(context.Background(), &p, []byte(capiCluster("prod-eu", true)), tc.refs)
			if len(pv.Errors) != 1 || pv.Errors[0].Field != "references[0]" || pv.Errors[0].Reason != tc.reason || !strings.Contains(pv.Errors[0].Message, tc.substr) {
				t.Fatalf("errors %s", errFields(pv.Errors))
			}
			if pv.Cluster != nil || pv.Create {
				t.Fatalf("rendered despite a missing reference: %+v", pv)
			}
			want := []string{"True", "False", "Unknown"}
			for i, c := range pv.Conditions {
				if c.Status != want[i] {
					t.Fatalf("conditions %+v", pv.Conditions)
				}
			}
			if pv.Conditions[1].Reason != tc.reason {
				t.Fatalf("conditions %+v", pv.Conditions)
			}
		})
	}

	// An empty rendered name is its own error, before any fetch.
	pv := e.Preview(context.Background(), &p, []byte(`{"apiVersion":"cluster.x-k8s.io/v1beta1","metadata":{"name":""}}`), nil)
	if len(pv.Errors) == 0 || pv.Errors[0].Reason != ReasonInvalidSource {
		t.Fatalf("errors %s", errFields(pv.Errors))
	}
	p.References[0].NameTemplate = "{{ .source.spec.nothing }}"
	pv = e.Preview(context.Background(), &p, []byte(capiCluster("prod-eu", true)), nil)
	if len(pv.Errors) != 1 || pv.Errors[0].Field != "references[0].name_template" || pv.Errors[0].Reason != ReasonReferenceInvalid {
		t.Fatalf("errors %s", errFields(pv.Errors))
	}
}

func TestValidate(t *testing.T) {
	e := NewEngine(Limits{})
	good := capiPolicy
	for _, tc := range []struct {
		name   string
		mutate func(p *ImportPolicy)
		field  string
		substr string
	}{
		{"ok", func(p *ImportPolicy) {}, "", ""},
		{"no name", func(p *ImportPolicy) { p.Name = "" }, "name", "required"},
		{"no cluster", func(p *ImportPolicy) { p.Source.Cluster = "" }, "source.cluster", "required"},
		{"bad resource", func(p *ImportPolicy) { p.Source.Resource = "Clusters" }, "source.resource", "RFC 1123"},
		{"parse error with position", func(p *ImportPolicy) {
			p.References = append(p.References, Reference{Key: "b", Resource: "secrets", NameTemplate: "ok-{{ .source.metadata.name"})
		}, "references[1].name_template", "1:"},
		{"unclosed if", func(p *ImportPolicy) { p.Template = "a: b\n{{ if .source }}\nc: d\n" }, "template", "unexpected EOF"},
		{"env is gone", func(p *ImportPolicy) { p.Template = `token: "{{ env "HOME" }}"` }, "template", `function "env" not defined`},
		{"expandenv is gone", func(p *ImportPolicy) { p.CreationCondition = `{{ expandenv "$HOME" }}` }, "creation_condition", `function "expandenv" not defined`},
		{"getHostByName is gone", func(p *ImportPolicy) { p.NameTemplate = `{{ getHostByName "example.com" }}` }, "name_template", `function "getHostByName" not defined`},
		{"now is gone", func(p *ImportPolicy) { p.Template = `{{ now }}` }, "template", `function "now" not defined`},
		{"genPrivateKey is gone", func(p *ImportPolicy) { p.Template = `{{ genPrivateKey "rsa" }}` }, "template", `not defined`},
		{"define", func(p *ImportPolicy) { p.Template = `{{ define "x" }}{{ template "x" }}{{ end }}{{ template "x" }}` }, "template", "not supported"},
		{"name reads references", func(p *ImportPolicy) { p.NameTemplate = "{{ .references.kubeconfig.metadata.name }}" }, "name_template", "sees .source only"},
		{"selector reads references", func(p *ImportPolicy) { p.Source.SelectorTemplate = `{{ index .references "kubeconfig" }}` }, "source.selector_template", "sees .source only"},
		{"template reads unknown key", func(p *ImportPolicy) { p.Template = "{{ .references.kubecfg.data.value }}" }, "template", "no reference has key"},
		{"no creation condition", func(p *ImportPolicy) { p.CreationCondition = "  " }, "creation_condition", "required"},
		{"bad key", func(p *ImportPolicy) { p.References[0].Key = "kube-config" }, "references[0].key", "letters, digits"},
		{"duplicate key", func(p *ImportPolicy) { p.References = append(p.References, p.References[0]) }, "references[1].key", "also the key of references[0]"},
		{"no reference name", func(p *ImportPolicy) { p.References[0].NameTemplate = "" }, "references[0].name_template", "required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := good()
			tc.mutate(&p)
			errs := e.Validate(&p)
			if tc.field == "" {
				if errs != nil {
					t.Fatalf("errors: %s", errFields(errs))
				}
				return
			}
			for _, fe := range errs {
				if fe.Field == tc.field && strings.Contains(fe.Message, tc.substr) {
					if fe.Error() != tc.field+": "+fe.Message {
						t.Fatalf("error text %q", fe.Error())
					}
					return
				}
			}
			t.Fatalf("errors:\n%s\nwant %s: …%s…", errFields(errs), tc.field, tc.substr)
		})
	}
}

func TestSandboxLimits(t *testing.T) {
	src := []byte(`{"metadata":{"name":"s"},"spec":{"items":[1,2,3]}}`)
	for _, tc := range []struct {
		name     string
		limits   Limits
		template string
		reason   string
		err      error
	}{
		{"output too large", Limits{}, `{{ range until 10000 }}0123456789{{ end }}`, ReasonRenderTooLarge, ErrRenderTooLarge},
		{"silent nested loops", Limits{}, `{{ range until 10000 }}{{ range until 10000 }}{{ end }}{{ end }}`, ReasonRenderTimeout, ErrRenderTimeout},
		{"range over an int", Limits{}, `{{ range 1000000000000 }}{{ end }}`, ReasonRenderTimeout, ErrRenderTimeout},
		{"timeout", Limits{Timeout: 100 * time.Millisecond, MaxSteps: 1 << 40}, `{{ range until 10000 }}{{ range until 10000 }}{{ end }}{{ end }}`, ReasonRenderTimeout, ErrRenderTimeout},
		{"doubling a string", Limits{}, `{{ $s := "0123456789" }}{{ range until 40 }}{{ $s = print $s $s }}{{ end }}`, ReasonRenderTooLarge, ErrRenderTooLarge},
		{"doubling a list", Limits{}, `{{ $l := list "0123456789abcdef" }}{{ range until 40 }}{{ $l = concat $l $l }}{{ end }}`, ReasonRenderTooLarge, ErrRenderTooLarge},
		{"huge until", Limits{}, `{{ until 1000000000 }}`, ReasonTemplateFailed, nil},
		{"huge repeat", Limits{}, `{{ repeat 1000000000 "x" }}`, ReasonTemplateFailed, nil},
		{"huge printf width", Limits{}, `{{ printf "%999999999d" 1 }}`, ReasonTemplateFailed, nil},
		{"replace everywhere", Limits{}, `{{ $s := repeat 3000 "x" }}{{ replace "" $s $s }}`, ReasonTemplateFailed, nil},
		{"quadratic uniq", Limits{}, `{{ uniq (until 5000) }}`, ReasonTemplateFailed, nil},
		{"printf with an indexed star", Limits{}, `{{ printf "%[2]*[1]d" 1 999999999 }}`, ReasonTemplateFailed, nil},
		{"printf with zero padding", Limits{}, `{{ printf "%0000099999d" 1 }}`, ReasonTemplateFailed, nil},
		// A map inside itself would crash the process when printed.
		{"map in itself", Limits{}, `{{ $d := dict }}{{ $_ := set $d "x" $d }}{{ $d }}`, ReasonTemplateFailed, nil},
		{"map in itself, deeper", Limits{}, `{{ $d := dict }}{{ $_ := set $d "x" (list (dict "y" $d)) }}{{ $d }}`, ReasonTemplateFailed, nil},
		{"merged into itself", Limits{}, `{{ $d := dict }}{{ $_ := merge $d (dict "x" $d) }}{{ $d }}`, ReasonTemplateFailed, nil},
		{"exponential sharing", Limits{}, `{{ $d := dict "s" (repeat 100 "x") }}{{ range until 40 }}{{ $d = dict "a" $d "b" $d }}{{ end }}{{ $d }}`, ReasonRenderTooLarge, ErrRenderTooLarge},
		{"pretty JSON of a big list", Limits{}, `{{ $l := list }}{{ range until 5000 }}{{ $l = append $l (repeat 1000 "x") }}{{ end }}{{ toPrettyJson $l }}`, ReasonRenderTooLarge, ErrRenderTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.limits.Timeout == 0 {
				// A generous clock, so that a loaded test machine hits the limit under test
				// rather than the timeout.
				tc.limits.Timeout = 10 * time.Second
			}
			e := NewEngine(tc.limits)
			p := ImportPolicy{Name: "p", Source: Source{Cluster: "c", Resource: "things"}, NameTemplate: "n", Template: tc.template, CreationCondition: "true"}
			c, errs := e.Compile(&p)
			if errs != nil {
				t.Fatal(errs)
			}
			start := time.Now()
			res := e.Render(context.Background(), c, src, nil)
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("took %v", d)
			}
			if len(res.Errors) != 1 || res.Errors[0].Field != "template" || res.Errors[0].Reason != tc.reason {
				t.Fatalf("errors %s", errFields(res.Errors))
			}
			if r := res.Conditions[2]; r.Status != "False" || r.Reason != tc.reason {
				t.Fatalf("rendered condition %+v", r)
			}
			if tc.err != nil {
				out, err := execute(context.Background(), c.template, map[string]any{}, e.funcs, e.limits)
				if !errors.Is(err, tc.err) {
					t.Fatalf("execute: %q, %v; want %v", out, err, tc.err)
				}
			}
		})
	}

	// A cancelled context stops the render too.
	e := NewEngine(Limits{MaxSteps: 1 << 40, Timeout: time.Hour})
	p := ImportPolicy{Name: "p", Source: Source{Cluster: "c", Resource: "things"}, NameTemplate: "n",
		Template: `{{ range until 10000 }}{{ range until 10000 }}{{ end }}{{ end }}`, CreationCondition: "true"}
	c, _ := e.Compile(&p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if res := e.Render(ctx, c, src, nil); len(res.Errors) != 1 || res.Errors[0].Reason != ReasonRenderTimeout {
		t.Fatalf("errors %s", errFields(res.Errors))
	}
}

func TestTemplatesDoNotSeeEachOthersChanges(t *testing.T) {
	e := NewEngine(Limits{})
	p := ImportPolicy{Name: "p", Source: Source{Cluster: "c", Resource: "things"}, NameTemplate: "{{ .source.metadata.name }}",
		CreationCondition: `{{ $_ := set .source.metadata "name" "changed" }}true`,
		Template:          `labels: {name: "{{ .source.metadata.name }}"}`}
	pv := e.Preview(context.Background(), &p, []byte(`{"metadata":{"name":"orig"}}`), nil)
	if len(pv.Errors) > 0 || pv.Cluster.Labels["name"] != "orig" || !pv.Create {
		t.Fatalf("preview %+v %s", pv.Cluster, errFields(pv.Errors))
	}
}

func TestSelector(t *testing.T) {
	e := NewEngine(Limits{})
	// Clusterpedia's kubevela example: secrets selected by namespace and label.
	p := ImportPolicy{Name: "vela", Source: Source{Cluster: "c", Resource: "secrets", SelectorTemplate: `
{{ if eq .source.metadata.namespace "vela-system" }}
  {{ if .source.metadata.labels }}
    {{ eq (index .source.metadata.labels "cluster.core.oam.dev/cluster-credential-type") "X509Certificate" }}
  {{ end }}
{{ end }}`}, NameTemplate: "vela-{{ .source.metadata.name }}", Template: "{}", CreationCondition: "true"}
	sel := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"a","namespace":"vela-system","labels":{"cluster.core.oam.dev/cluster-credential-type":"X509Certificate"}}}`
	other := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"b","namespace":"default"}}`
	if pv := e.Preview(context.Background(), &p, []byte(sel), nil); len(pv.Errors) > 0 || pv.Name != "vela-a" || pv.Conditions[0].Status != "True" {
		t.Fatalf("selected: %+v %s", pv, errFields(pv.Errors))
	}
	pv := e.Preview(context.Background(), &p, []byte(other), nil)
	if len(pv.Errors) > 0 || pv.Name != "" || pv.Conditions[0].Reason != ReasonNotSelected || pv.Cluster != nil {
		t.Fatalf("not selected: %+v", pv)
	}
}

func TestBadRenderedCluster(t *testing.T) {
	e := NewEngine(Limits{})
	for _, tc := range []struct {
		name     string
		nameTmpl string
		template string
		field    string
		substr   string
	}{
		{"name not DNS-1123", "Prod_EU", "{}", "name_template", "RFC 1123"},
		{"empty name", "{{ .source.nothing }}", "{}", "name_template", "empty name"},
		{"clusterpedia fields", "n", `spec: {apiserver: "https://x"}`, "template", `unknown field "spec"`},
		{"not YAML", "n", "labels: [a\n", "template", "not YAML"},
		{"bad label", "n", "labels: {a: 'not a label value!'}", `template: labels["a"]`, "value"},
		{"bad effect", "n", "taints: [{key: a, effect: NoSchedule}]", "template: taints[0].effect", "NoSelect"},
		{"http server", "n", "credentials: {server: 'http://x', token: abcdefgh}", "template: credentials.server", "https"},
		{"no token", "n", "credentials: {server: 'https://x'}", "template: credentials", "token or a client certificate"},
		{"bad base64", "n", "credentials: {server: 'https://x', token: t, certificateAuthorityData: '%%%'}", "template", "base64"},
		{"bad kubeconfig", "n", "credentials: {kubeconfig: 'bm90IGEga3ViZWNvbmZpZw=='}", "template: credentials.kubeconfig", "not a valid kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ImportPolicy{Name: "p", Source: Source{Cluster: "c", Resource: "things"}, NameTemplate: tc.nameTmpl, Template: tc.template, CreationCondition: "true"}
			pv := e.Preview(context.Background(), &p, []byte(`{"metadata":{"name":"s"}}`), nil)
			for _, fe := range pv.Errors {
				if fe.Field == tc.field && strings.Contains(fe.Message, tc.substr) {
					if pv.Conditions[2].Status != "False" {
						t.Fatalf("conditions %+v", pv.Conditions)
					}
					return
				}
			}
			t.Fatalf("errors:\n%s\nwant %s: …%s…", errFields(pv.Errors), tc.field, tc.substr)
		})
	}
}

func TestCredentialsNeverShown(t *testing.T) {
	e := NewEngine(Limits{})
	for _, tc := range []struct {
		name     string
		template string
		cond     string
	}{
		{"fail quotes the base64", `{{ fail .references.kubeconfig.data.value }}`, "true"},
		{"fail quotes the kubeconfig", `{{ fail (b64dec .references.kubeconfig.data.value) }}`, "true"},
		{"fail quotes part of it", `{{ .references.kubeconfig.data.value | trunc 40 | fail }}`, "true"},
		{"fail quotes the token line", `{{ b64dec .references.kubeconfig.data.value | regexFind "token: .*" | fail }}`, "true"},
		{"condition quotes it", `{}`, `{{ fail (b64dec .references.kubeconfig.data.value) }}`},
		{"printf of the token into a type error", `{{ printf "%d" (b64dec .references.kubeconfig.data.value) | fail }}`, "true"},
		{"token in a label", `labels: {t: "{{ b64dec .references.kubeconfig.data.value | regexFind "capi-admin-token" }}"}
credentials: {kubeconfig: "{{ .references.kubeconfig.data.value }}"}`, "true"},
		{"token in a claim", `claims: {t: "{{ b64dec .references.kubeconfig.data.value | regexFind "eyJ.*" }}"}`, "true"},
		{"kubeconfig and token together", `credentials: {kubeconfig: "{{ .references.kubeconfig.data.value }}", token: "` + capiToken + `"}`, "true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := capiPolicy()
			p.Template, p.CreationCondition = tc.template, tc.cond
			pv := e.Preview(context.Background(), &p, []byte(capiCluster("prod-eu", true)), refs("kubeconfig", capiSecret("prod-eu")))
			if len(pv.Errors) == 0 {
				t.Fatalf("no error: %+v", pv)
			}
			if !strings.Contains(pv.Errors.Error(), redacted) && !strings.Contains(pv.Errors.Error(), "secret") && !strings.Contains(pv.Errors.Error(), "not both") {
				t.Fatalf("errors %s", errFields(pv.Errors))
			}
			assertNoSecret(t, pv, allSecrets...)
			assertNoSecret(t, pv, "capi-admin-token")
		})
	}
}

func TestRedactor(t *testing.T) {
	var r redactor
	r.add("short")
	r.add("0123456789abcdefghijklmnop")
	for in, want := range map[string]string{
		"nothing here":                           "nothing here",
		"short stays":                            "short stays",
		"x 0123456789abcdefghijklmnop y":         "x [redacted] y",
		"cut: 0123456789abcdefgh…":               "cut: [redacted]…",
		"middle 456789abcdefghijklm end":         "middle [redacted] end",
		"too short a piece 0123456789abcde here": "too short a piece 0123456789abcde here",
	} {
		if got := r.redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func BenchmarkRenderCAPI(b *testing.B) {
	e := NewEngine(Limits{})
	p := capiPolicy()
	c, errs := e.Compile(&p)
	if errs != nil {
		b.Fatal(errs)
	}
	src := []byte(capiCluster("prod-eu", true))
	secret := []byte(capiSecret("prod-eu"))
	f := FetcherFunc(func(context.Context, Target) ([]byte, error) { return secret, nil })
	b.ReportAllocs()
	for b.Loop() {
		if res := e.Render(context.Background(), c, src, f); len(res.Errors) > 0 {
			b.Fatal(res.Errors)
		}
	}
}

func TestRemovedFunctionsAreSprigs(t *testing.T) {
	// The list must name real sprig functions, or a renamed one would slip back in.
	all := sprig.TxtFuncMap()
	fm := baseFuncs()
	for name := range RemovedFunctions() {
		if _, ok := all[name]; !ok {
			t.Errorf("%s is not a sprig function", name)
		}
		if _, ok := fm[name]; ok {
			t.Errorf("%s is still available", name)
		}
	}
}

func TestDeepObjectRefused(t *testing.T) {
	e := NewEngine(Limits{})
	p := ImportPolicy{Name: "p", Source: Source{Cluster: "c", Resource: "things"}, NameTemplate: "n", Template: "{}", CreationCondition: "true"}
	deep := `{"metadata":{"name":"s"},"spec":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`
	pv := e.Preview(context.Background(), &p, []byte(deep), nil)
	if len(pv.Errors) != 1 || pv.Errors[0].Reason != ReasonInvalidSource || !strings.Contains(pv.Errors[0].Message, "deeper") {
		t.Fatalf("errors %s", errFields(pv.Errors))
	}
	big := `{"metadata":{"name":"s"},"spec":"` + strings.Repeat("x", 3<<20) + `"}`
	if pv := e.Preview(context.Background(), &p, []byte(big), nil); len(pv.Errors) != 1 || pv.Errors[0].Reason != ReasonInvalidSource {
		t.Fatalf("errors %s", errFields(pv.Errors))
	}
}

func TestConcurrentRenders(t *testing.T) {
	// One Compiled serves every lifecycle of a policy, from many goroutines.
	e := NewEngine(Limits{Timeout: 10 * time.Second})
	p := capiPolicy()
	c, errs := e.Compile(&p)
	if errs != nil {
		t.Fatal(errs)
	}
	done := make(chan string)
	for i := range 8 {
		go func() {
			name := fmt.Sprintf("c%d", i)
			secret := []byte(capiSecret(name))
			res := e.Render(context.Background(), c, []byte(capiCluster(name, i%2 == 0)), FetcherFunc(func(context.Context, Target) ([]byte, error) { return secret, nil }))
			if len(res.Errors) > 0 || res.Name != "capi-"+name || res.Create != (i%2 == 0) {
				done <- fmt.Sprintf("%s: %+v %s", name, res, errFields(res.Errors))
				return
			}
			done <- ""
		}()
	}
	for range 8 {
		if msg := <-done; msg != "" {
			t.Error(msg)
		}
	}
}

func TestPrintfAndSetStillWork(t *testing.T) {
	e := NewEngine(Limits{})
	p := ImportPolicy{Name: "p", Source: Source{Cluster: "c", Resource: "things"}, NameTemplate: `{{ printf "%s-%03d" .source.metadata.name 7 }}`,
		Template:          `{{ $d := dict "a" "1" }}{{ $_ := set $d "b" "2" }}{{ $_ := merge $d (dict "c" "3") }}labels: {{ toJson $d }}`,
		CreationCondition: `{{ printf "%6.4v" "true" | trim }}`}
	pv := e.Preview(context.Background(), &p, []byte(`{"metadata":{"name":"s"}}`), nil)
	if len(pv.Errors) > 0 || pv.Name != "s-007" || !pv.Create || len(pv.Cluster.Labels) != 3 {
		t.Fatalf("%+v %+v %s", pv, pv.Cluster, errFields(pv.Errors))
	}
}

func TestArgoCDSecretFields(t *testing.T) {
	// An Argo CD cluster Secret keeps the name and server beside the credentials: the server
	// may go into credentials, but nothing of the Secret's data may become a label or a claim,
	// not even its name: Secret data flows into credentials only. The Secret's metadata may.
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	const bearer = "argocd-bearer-token-abcdef0123456789"
	secret := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"prod","namespace":"argocd","labels":{"argocd.argoproj.io/secret-type":"cluster"}},
	"data":{"name":"` + b64("prod-cluster") + `","server":"` + b64("https://prod.example.com:6443") + `",
	"config":"` + b64(`{"bearerToken":"`+bearer+`","tlsClientConfig":{"insecure":false,"caData":"`+karmadaCA+`"}}`) + `"}}`
	p := ImportPolicy{Name: "argo", Source: Source{Cluster: "argo", Resource: "secrets",
		SelectorTemplate: `{{ eq (index .source.metadata.labels "argocd.argoproj.io/secret-type") "cluster" }}`},
		NameTemplate: `argo-{{ .source.metadata.name }}`,
		Template: `labels: {argo-secret: "{{ .source.metadata.name }}"}
credentials:
  server: "{{ b64dec .source.data.server }}"
  certificateAuthorityData: '{{ (b64dec .source.data.config | fromJson).tlsClientConfig.caData }}'
  token: '{{ b64dec .source.data.config | regexFind "argocd-bearer-token-[a-z0-9]+" }}'
`,
		CreationCondition: "true"}
	e := NewEngine(Limits{})
	pv := e.Preview(context.Background(), &p, []byte(secret), nil)
	if len(pv.Errors) > 0 || pv.Cluster.Labels["argo-secret"] != "prod" || pv.Cluster.Server != "https://prod.example.com:6443" || !pv.Cluster.CredentialsRendered {
		t.Fatalf("%+v %+v %s", pv, pv.Cluster, errFields(pv.Errors))
	}
	assertNoSecret(t, pv, bearer)

	for _, tmpl := range []string{
		`claims: {t: '{{ b64dec .source.data.config | regexFind "argocd-bearer-token-[a-z0-9]+" }}'}`,
		`labels: {argo-name: "{{ b64dec .source.data.name }}"}`,
	} {
		p.Template = tmpl
		pv = e.Preview(context.Background(), &p, []byte(secret), nil)
		if len(pv.Errors) != 1 || pv.Cluster != nil || (!strings.Contains(pv.Errors[0].Message, "secret value") && pv.Errors[0].Reason != ReasonSecretDerived) {
			t.Fatalf("%s: %+v %s", tmpl, pv, errFields(pv.Errors))
		}
		assertNoSecret(t, pv, bearer, "prod-cluster")
	}
}

// TestSecretDerivedOutputsAreRefused performs the attack of issue 25 item 7: a template that
// computes a shown field from a referenced Secret's token (hex, upper case, 15-byte chunks,
// ...) instead of copying it. Literal redaction misses every one of these; each is refused on
// its field, and the preview shows nothing of the token in any form.
func TestSecretDerivedOutputsAreRefused(t *testing.T) {
	e := NewEngine(Limits{})
	tok := `(.references.secret.data.token | b64dec)`
	hex := fmt.Sprintf("%x", karmadaToken)
	forms := []string{karmadaToken, hex, strings.ToUpper(karmadaToken), karmadaToken[:15], karmadaToken[15:30], hex[:30],
		base64.StdEncoding.EncodeToString([]byte(karmadaToken))}
	for _, tc := range []struct {
		name, doc, field string
	}{
		{"printf %x into a label", `labels: {x: '{{ printf "%x" ` + tok + ` | trunc 63 }}'}`, "template: labels[\"x\"]"},
		{"printf %x into a claim", `claims: {x: '{{ printf "%x" ` + tok + ` }}'}`, "template: claims[\"x\"]"},
		{"upper into a claim", `claims: {x: '{{ upper ` + tok + ` }}'}`, "template: claims[\"x\"]"},
		{"substr 0 15", `claims: {x: '{{ substr 0 15 ` + tok + ` }}'}`, "template: claims[\"x\"]"},
		{"substr 15 30", `claims: {x: '{{ substr 15 30 ` + tok + ` }}'}`, "template: claims[\"x\"]"},
		{"one byte per claim", `claims:{{ range $i, $c := regexSplit "" ` + tok + ` -1 }}
  c{{ $i }}: '{{ $c }}'{{ end }}`, "template: claims[\"c0\"]"},
		{"the raw base64 data", `claims: {x: '{{ .references.secret.data.token | trunc 15 }}'}`, "template: claims[\"x\"]"},
		{"a key", `claims: {'{{ substr 0 14 ` + tok + ` }}': "v"}`, "template: claims"},
		{"a taint value", `taints: [{key: k, value: '{{ substr 0 15 ` + tok + ` | replace "-" "x" }}', effect: NoSelect}]`, "template: taints[0]"},
		{"a length-independent bit", `labels: {jwt: '{{ hasPrefix "karmada" ` + tok + ` }}'}`, "template: labels[\"jwt\"]"},
		{"the shape of the document", `{{ if hasPrefix "karmada" ` + tok + ` }}claims: {jwt: "yes"}{{ end }}`, "template: claims"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := karmadaPolicy()
			p.Template = tc.doc + `
credentials:
  server: "{{ .source.spec.apiEndpoint }}"
  token: "{{ .references.secret.data.token | b64dec }}"
`
			pv := e.Preview(context.Background(), &p, []byte(karmadaCluster("m1", "Push")), refs("secret", karmadaSecret("m1")))
			if pv.Cluster != nil || len(pv.Errors) == 0 {
				t.Fatalf("not refused: %+v %+v", pv, pv.Cluster)
			}
			found := false
			for _, fe := range pv.Errors {
				found = found || (fe.Field == tc.field && fe.Reason == ReasonSecretDerived)
			}
			if !found {
				t.Fatalf("want %s [%s], got\n%s", tc.field, ReasonSecretDerived, errFields(pv.Errors))
			}
			if c := pv.Conditions[2]; c.Type != ConditionRendered || c.Status != "False" || c.Reason != ReasonSecretDerived {
				t.Errorf("Rendered condition %+v", c)
			}
			assertNoSecret(t, pv, forms...)
		})
	}

	t.Run("a name from the source Secret's data", func(t *testing.T) {
		p := ImportPolicy{Name: "s", Source: Source{Cluster: "c", Resource: "secrets"},
			NameTemplate: `s-{{ .source.data.token | b64dec | substr 0 15 | lower }}`, Template: `labels: {a: b}`, CreationCondition: "true"}
		src := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"},"data":{"token":"` + base64.StdEncoding.EncodeToString([]byte("abcdefghijklmnopqrstuvwxyz")) + `"}}`
		pv := e.Preview(context.Background(), &p, []byte(src), nil)
		if pv.Name != "" || len(pv.Errors) != 1 || pv.Errors[0].Field != "name_template" || pv.Errors[0].Reason != ReasonSecretDerived {
			t.Fatalf("%+v %s", pv, errFields(pv.Errors))
		}
		assertNoSecret(t, pv, "abcdefghijklmno")
	})

	t.Run("the label that allows an import to replace credentials", func(t *testing.T) {
		p := karmadaPolicy()
		p.Template = `labels: {fleetstream.io/allow-import-credentials: "true"}`
		pv := e.Preview(context.Background(), &p, []byte(karmadaCluster("m1", "Push")), refs("secret", karmadaSecret("m1")))
		if pv.Cluster != nil || len(pv.Errors) != 1 || pv.Errors[0].Field != `template: labels["fleetstream.io/allow-import-credentials"]` {
			t.Fatalf("%+v %s", pv, errFields(pv.Errors))
		}
	})

	t.Run("what stays allowed", func(t *testing.T) {
		// The Secret's metadata, and its shape (how long a value is, whether it is set): the
		// same with or without the Secret's data.
		p := karmadaPolicy()
		p.Template = `labels:
  secret: "{{ .references.secret.metadata.name }}"
  has-token: "{{ if .references.secret.data.token }}yes{{ end }}"
claims:
  token-length: "{{ len (.references.secret.data.token | b64dec) }}"
credentials:
  server: "{{ .source.spec.apiEndpoint }}"
  token: "{{ .references.secret.data.token | b64dec }}"
`
		pv := e.Preview(context.Background(), &p, []byte(karmadaCluster("m1", "Push")), refs("secret", karmadaSecret("m1")))
		if len(pv.Errors) > 0 || pv.Cluster.Labels["secret"] != "m1" || pv.Cluster.Labels["has-token"] != "yes" ||
			pv.Cluster.Claims["token-length"] != fmt.Sprint(len(karmadaToken)) || !pv.Cluster.CredentialsRendered {
			t.Fatalf("%+v %+v %s", pv, pv.Cluster, errFields(pv.Errors))
		}
	})
}
