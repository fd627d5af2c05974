package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/services/fleetctl/manifest"
)

// TestDiffHidesImportPolicyTemplate: diff's output goes to CI logs, and an import policy's live
// template may hold a credential someone wrote through the API. diff shows a short sha256 of
// each side's template instead, so a change is still seen; the other fields show as they are.
func TestDiffHidesImportPolicyTemplate(t *testing.T) {
	policy := func(nameTemplate, template string) *manifest.Object {
		t.Helper()
		objs, err := manifest.Decode("p.yaml", strings.NewReader(`apiVersion: fleetstream.io/v1alpha1
kind: ImportPolicy
metadata: {name: capi}
spec:
  source: {cluster: eu-1, group: cluster.x-k8s.io, version: v1beta1, resource: clusters}
  nameTemplate: "`+nameTemplate+`"
  template: `+template+`
`))
		if err != nil {
			t.Fatal(err)
		}
		return objs[0]
	}
	sum := func(s string) string {
		b := sha256.Sum256([]byte(s))
		return hex.EncodeToString(b[:])[:12]
	}
	const secret = "hunter2-s3cr3t"
	// As the API holds it: a manifest with a literal credential would be refused.
	withTemplate := func(o *manifest.Object, template string) *manifest.Object {
		c := *o
		spec := proto.Clone(o.Spec).(*clusterv1.ImportPolicy)
		spec.Template = template
		c.Spec = spec
		return &c
	}
	liveTemplate := "credentials: {token: " + secret + "}"
	declaredTemplate := `"credentials: {token: '{{ .references.token.data.value }}'}"`
	declared := policy("{{ .source.metadata.name }}", declaredTemplate)
	live := &liveObject{obj: withTemplate(policy("old-{{ .source.metadata.name }}", declaredTemplate), liveTemplate)}

	for name, tc := range map[string]struct {
		live *liveObject
		want []string
	}{
		"changed": {live: live, want: []string{
			"sha256 " + sum("credentials: {token: "+secret+"}"), "sha256 " + sum("credentials: {token: '{{ .references.token.data.value }}'}"),
			`-  nameTemplate: old-{{ .source.metadata.name }}`,
		}},
		"created": {want: []string{"sha256 " + sum("credentials: {token: '{{ .references.token.data.value }}'}")}},
	} {
		t.Run(name, func(t *testing.T) {
			d, err := diffObject(declared, tc.live)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(d, secret) || strings.Contains(d, "references.token") {
				t.Fatalf("diff shows a template:\n%s", d)
			}
			for _, w := range tc.want {
				if !strings.Contains(d, w) {
					t.Errorf("diff lacks %q:\n%s", w, d)
				}
			}
		})
	}
	// Only the template differs: still a difference (the sums differ).
	if d, err := diffObject(policy("n", declaredTemplate), &liveObject{obj: withTemplate(policy("n", declaredTemplate), liveTemplate)}); err != nil || d == "" || strings.Contains(d, secret) {
		t.Fatalf("template-only change: %v\n%q", err, d)
	}
}
