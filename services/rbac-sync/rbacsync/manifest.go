package rbacsync

import (
	"encoding/json"
	"fmt"
	"sort"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// Names and labels of what rbac-sync puts on member clusters.
const (
	// ObjectPrefix prefixes the ClusterRole of a template and the RoleBinding of a role in a
	// namespace: `fleetstream:<template>` for both, so names are deterministic and one
	// RoleBinding per (namespace, role) holds every subject of that role.
	ObjectPrefix = "fleetstream:"
	// OwnerLabel marks objects rbac-sync owns; the agent refuses to touch a live object that
	// carries it with another value (see desiredv1.DesiredObject.owner_label_key).
	OwnerLabel = "fleetstream.io/owner"
	OwnerValue = "rbac-sync"
	// TemplateLabel and ProjectLabel say which template and project an object comes from, so
	// `kubectl get rolebindings -l fleetstream.io/project=team-a` works on a member cluster.
	TemplateLabel = "rbac.fleetstream.io/template"
	ProjectLabel  = "fleetstream.io/project"

	kindClusterRole = "ClusterRole"
	kindRoleBinding = "RoleBinding"
	rbacGroup       = "rbac.authorization.k8s.io"
)

// ObjectName is the name of a template's ClusterRole and of its RoleBindings.
func ObjectName(template string) string { return ObjectPrefix + template }

type objectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type policyRule struct {
	Verbs           []string `json:"verbs"`
	APIGroups       []string `json:"apiGroups,omitempty"`
	Resources       []string `json:"resources,omitempty"`
	ResourceNames   []string `json:"resourceNames,omitempty"`
	NonResourceURLs []string `json:"nonResourceURLs,omitempty"`
}

type clusterRole struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Metadata   objectMeta   `json:"metadata"`
	Rules      []policyRule `json:"rules"`
}

type roleRef struct {
	APIGroup string `json:"apiGroup"`
	Kind     string `json:"kind"`
	Name     string `json:"name"`
}

type k8sSubject struct {
	Kind      string `json:"kind"`
	APIGroup  string `json:"apiGroup,omitempty"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

type roleBinding struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Metadata   objectMeta   `json:"metadata"`
	RoleRef    roleRef      `json:"roleRef"`
	Subjects   []k8sSubject `json:"subjects"`
}

// clusterRoleObject is the desired ClusterRole of template with its effective rules. The JSON
// is deterministic (struct fields in order, maps sorted), so equal inputs give equal bytes and
// an unchanged object is never rewritten.
func clusterRoleObject(template string, rules []*rbacv1.PolicyRule) *desiredv1.DesiredObject {
	cr := clusterRole{
		APIVersion: rbacGroup + "/v1", Kind: kindClusterRole,
		Metadata: objectMeta{Name: ObjectName(template), Labels: map[string]string{OwnerLabel: OwnerValue, TemplateLabel: template}},
		Rules:    make([]policyRule, len(rules)),
	}
	for i, r := range rules {
		cr.Rules[i] = policyRule{Verbs: r.Verbs, APIGroups: r.ApiGroups, Resources: r.Resources, ResourceNames: r.ResourceNames, NonResourceURLs: r.NonResourceUrls}
	}
	return desiredObject(cr)
}

// roleBindingObject is the desired RoleBinding of template in namespace, for project, binding
// the subjects marshalled in subjectsJSON (see marshalSubjects) to the template's ClusterRole.
// It is written out by hand because one binding change builds one per namespace of a project,
// thousands at a time, all sharing the subject list; the bytes equal json.Marshal of the
// roleBinding struct (manifest_test.go checks), so equal inputs give equal bytes.
func roleBindingObject(project, namespace, template string, subjectsJSON []byte) *desiredv1.DesiredObject {
	name := ObjectName(template)
	b := make([]byte, 0, 320+len(subjectsJSON))
	b = append(b, `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"RoleBinding","metadata":{"name":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"namespace":`...)
	b = appendJSONString(b, namespace)
	// Label keys in the order encoding/json sorts map keys.
	b = append(b, `,"labels":{"`+OwnerLabel+`":"`+OwnerValue+`","`+ProjectLabel+`":`...)
	b = appendJSONString(b, project)
	b = append(b, `,"`+TemplateLabel+`":`...)
	b = appendJSONString(b, template)
	b = append(b, `}},"roleRef":{"apiGroup":"`+rbacGroup+`","kind":"`+kindClusterRole+`","name":`...)
	b = appendJSONString(b, name)
	b = append(b, `},"subjects":`...)
	b = append(b, subjectsJSON...)
	b = append(b, '}')
	return &desiredv1.DesiredObject{Manifest: b, Owner: OwnerValue, OwnerLabelKey: OwnerLabel, OwnerLabelValue: OwnerValue}
}

// marshalSubjects is the JSON of a RoleBinding's subjects, sorted.
func marshalSubjects(subjects []*rbacv1.Subject) []byte {
	sorted := sortSubjects(subjects)
	out := make([]k8sSubject, len(sorted))
	for i, s := range sorted {
		out[i] = toK8sSubject(s)
	}
	data, err := json.Marshal(out)
	if err != nil {
		panic(fmt.Sprintf("marshal subjects: %v", err))
	}
	return data
}

// appendJSONString appends s as a JSON string the way encoding/json writes it.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			data, _ := json.Marshal(s)
			return append(b, data...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func desiredObject(obj any) *desiredv1.DesiredObject {
	data, err := json.Marshal(obj)
	if err != nil {
		// Only plain strings, slices and string maps: marshalling cannot fail.
		panic(fmt.Sprintf("marshal manifest: %v", err))
	}
	return &desiredv1.DesiredObject{
		Manifest:        data,
		Owner:           OwnerValue,
		OwnerLabelKey:   OwnerLabel,
		OwnerLabelValue: OwnerValue,
	}
}

// tombstone says the object of a key must go; kept in the bucket so an agent that was offline
// at the time still deletes it when it returns.
func tombstone() *desiredv1.DesiredObject {
	return &desiredv1.DesiredObject{
		Tombstone:       true,
		DeletionPolicy:  desiredv1.DeletionPolicy_DELETION_POLICY_DELETE,
		Owner:           OwnerValue,
		OwnerLabelKey:   OwnerLabel,
		OwnerLabelValue: OwnerValue,
	}
}

func toK8sSubject(s *rbacv1.Subject) k8sSubject {
	switch s.Kind {
	case rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT:
		return k8sSubject{Kind: "ServiceAccount", Name: s.Name, Namespace: s.Namespace}
	case rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		return k8sSubject{Kind: "Group", APIGroup: rbacGroup, Name: s.Name}
	default:
		return k8sSubject{Kind: "User", APIGroup: rbacGroup, Name: s.Name}
	}
}

func sortSubjects(in []*rbacv1.Subject) []*rbacv1.Subject {
	out := make([]*rbacv1.Subject, len(in))
	copy(out, in)
	sort.Slice(out, func(i, j int) bool { return subjectID(out[i]) < subjectID(out[j]) })
	return out
}

// subjectID identifies a subject: kind, namespace and name.
func subjectID(s *rbacv1.Subject) string {
	return fmt.Sprintf("%d/%s/%s", s.GetKind(), s.GetNamespace(), s.GetName())
}
