package manifest

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCRDSchemasAreStructural: what the API server requires of a CRD's schema, for every kind's
// spec (the kinds served today and any added to CRDKinds later): no additionalProperties false,
// no type lists (a 64-bit integer is int-or-string), every object typed.
func TestCRDSchemasAreStructural(t *testing.T) {
	for _, k := range Kinds() {
		spec := structural(k.messageSchema(k.Spec.ProtoReflect().Descriptor(), ""))
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch t2 := v.(type) {
			case map[string]any:
				if ap, ok := t2["additionalProperties"]; ok && ap == false {
					t.Errorf("%s: %s: additionalProperties false", k.Name, path)
				}
				if typ, ok := t2["type"]; ok {
					if _, isString := typ.(string); !isString {
						t.Errorf("%s: %s: type %v is not one type", k.Name, path, typ)
					}
				}
				for key, e := range t2 {
					if props, ok := e.(map[string]any); ok && key == "properties" {
						for name, ps := range props { // field names, each a schema
							walk(path+"."+name, ps)
						}
						continue
					}
					walk(path+"."+key, e)
				}
			case []any:
				for _, e := range t2 {
					walk(path+"[]", e)
				}
			}
		}
		walk("spec", spec)
	}
	// The same fields as the manifest's schema: a NamespaceBinding's are the manifest's plus
	// spec.project.
	crd, err := json.Marshal(KindNamed("NamespaceBinding").CRD())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"cluster"`, `"placement"`, `"hard"`, `"project"`, `"Namespaced"`, `"namespacebindings.fleetstream.io"`} {
		if !strings.Contains(string(crd), f) {
			t.Errorf("NamespaceBinding CRD lacks %s", f)
		}
	}
	if strings.Contains(string(crd), `"unbindPolicy"`) {
		t.Error("NamespaceBinding CRD has unbindPolicy, which manifests may not set")
	}
}
