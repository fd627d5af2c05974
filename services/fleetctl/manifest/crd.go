package manifest

import (
	"fmt"
	"strings"
)

// CRDKinds are the kinds the kube bridge serves as CustomResourceDefinitions on a hub API
// server (docs/kubernetes.md), in the order their files are written.
var CRDKinds = []string{"Project", "NamespaceBinding", "ProjectRoleBinding", "Placement", "RoleTemplate", "ClusterSet", "ClusterSetBinding", "ServiceWeights"}

// crdNamespaced are the kinds that are fleet-wide in a manifest but namespaced on a hub: a
// ServiceWeights names its member-cluster namespace in spec.namespace and is authorized by the
// project owning it, so on the hub it lives in a namespace mapped to that project (and carries
// no spec.project: the mapping alone says which project it acts in).
var crdNamespaced = map[string]bool{"ServiceWeights": true}

// CRDImmutable are, per kind, the spec fields a custom resource may not change once created:
// the ones that say which Fleetstream object it is (a binding is what it binds; a project's
// display name has no update in the API). Changing them would be a different object, so the
// hub refuses the change itself (a CEL transition rule) rather than the bridge half-doing it.
var crdImmutable = map[string][]string{
	"Project":            {"displayName"},
	"NamespaceBinding":   {"project", "cluster", "placement"},
	"ProjectRoleBinding": {"project", "subject", "roleTemplate"},
	"Placement":          {"project"},
	"ClusterSetBinding":  {"project", "clusterSet"},
	"ServiceWeights":     {"namespace"},
}

// CRD returns the CustomResourceDefinition of kind k in group fleetstream.io, version v1alpha1,
// whose spec schema is the manifest's (Schema's), made structural as the API server requires:
// the same fields, types and enums. A kind that lives in a project is namespaced and carries
// spec.project (metadata.project in a manifest; Kubernetes metadata has no such field); the
// others are cluster-scoped. Status holds metav1.Conditions the kube bridge writes.
func (k *Kind) CRD() map[string]any {
	spec := structural(k.messageSchema(k.Spec.ProtoReflect().Descriptor(), "")).(map[string]any)
	scope := "Cluster"
	if crdNamespaced[k.Name] {
		scope = "Namespaced"
	}
	if k.Project {
		scope = "Namespaced"
		props := spec["properties"].(map[string]any)
		props["project"] = map[string]any{
			"type": "string", "pattern": dnsLabel.String(),
			"description": "The project the object belongs to (a manifest's metadata.project). Optional: by default the project the hub namespace is mapped to (label fleetstream.io/project); any other is refused (status Forbidden).",
		}
	}
	var rules []any
	for _, f := range crdImmutable[k.Name] {
		rules = append(rules, map[string]any{
			"rule":    fmt.Sprintf("has(self.%[1]s) == has(oldSelf.%[1]s) && (!has(self.%[1]s) || self.%[1]s == oldSelf.%[1]s)", celField(f)),
			"message": "spec." + f + " cannot be changed: delete the object and create another",
		})
	}
	if len(rules) > 0 {
		spec["x-kubernetes-validations"] = rules
	}
	plural := strings.ToLower(k.Name)
	if !strings.HasSuffix(plural, "s") { // serviceweights is its own plural
		plural += "s"
	}
	return map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata": map[string]any{
			"name": plural + "." + Group,
			"annotations": map[string]any{
				"fleetstream.io/generated-from": "services/fleetctl/manifest (make generate): the schema of fleetctl apply's " + k.Name + " manifests",
			},
		},
		"spec": map[string]any{
			"group": Group,
			"names": map[string]any{
				"kind": k.Name, "listKind": k.Name + "List", "plural": plural, "singular": strings.ToLower(k.Name),
				"categories": []any{"fleetstream"},
			},
			"scope": scope,
			"versions": []any{map[string]any{
				"name": Version, "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"additionalPrinterColumns": []any{
					map[string]any{"name": "Ready", "type": "string", "jsonPath": `.status.conditions[?(@.type=="Ready")].status`},
					map[string]any{"name": "Reason", "type": "string", "jsonPath": `.status.conditions[?(@.type=="Ready")].reason`},
					map[string]any{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
				},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"description": k.Description,
					"type":        "object",
					"properties": map[string]any{
						"apiVersion": map[string]any{"type": "string"},
						"kind":       map[string]any{"type": "string"},
						"metadata":   map[string]any{"type": "object"},
						"spec":       spec,
						"status":     statusSchema,
					},
					"required": []any{"spec"},
				}},
			}},
		},
	}
}

// celField is how a CEL rule of a CRD names property f: a CEL reserved word (ServiceWeights'
// spec.namespace) is escaped as __f__, as the API server's CEL environment requires; unescaped,
// the rule does not resolve and the CRD is refused (an estimated cost past every budget).
func celField(f string) string {
	switch f {
	case "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if",
		"import", "let", "loop", "package", "namespace", "return", "var", "void", "while":
		return "__" + f + "__"
	}
	return f
}

// Group and Version of the custom resources: the manifests' APIVersion.
const (
	Group   = "fleetstream.io"
	Version = "v1alpha1"
)

// structural turns a JSON Schema of Schema's into an OpenAPI v3 structural schema: no
// additionalProperties false (the API server drops, or with strict field validation refuses,
// unknown fields by itself) and a 64-bit integer, which the API's JSON writes as a string too,
// as x-kubernetes-int-or-string.
func structural(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range t {
			switch {
			case k == "additionalProperties" && e == false:
				continue
			case k == "type":
				if list, ok := e.([]string); ok && len(list) == 2 && list[0] == "integer" && list[1] == "string" {
					out["x-kubernetes-int-or-string"] = true
					continue
				}
			}
			out[k] = structural(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = structural(e)
		}
		return out
	}
	return v
}

// statusSchema is a custom resource's status: metav1.Conditions, a list-map keyed by type (so
// the bridge's server-side apply owns each condition it writes).
var statusSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"conditions": map[string]any{
			"type":                       "array",
			"x-kubernetes-list-type":     "map",
			"x-kubernetes-list-map-keys": []any{"type"},
			"items": map[string]any{
				"type":     "object",
				"required": []any{"type", "status", "lastTransitionTime", "reason", "message"},
				"properties": map[string]any{
					"type":               map[string]any{"type": "string", "maxLength": 316},
					"status":             map[string]any{"type": "string", "enum": []any{"True", "False", "Unknown"}},
					"observedGeneration": map[string]any{"type": "integer", "format": "int64", "minimum": 0},
					"lastTransitionTime": map[string]any{"type": "string", "format": "date-time"},
					"reason":             map[string]any{"type": "string", "maxLength": 1024, "minLength": 1},
					"message":            map[string]any{"type": "string", "maxLength": 32768},
				},
			},
		},
	},
}
