package rbacsync

import (
	"encoding/json"
	"testing"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// The hand-written RoleBinding JSON must be byte for byte what encoding/json writes for the
// roleBinding struct, for any names (escaping included) and subjects.
func TestRoleBindingJSONMatchesEncodingJSON(t *testing.T) {
	subjects := []*rbacv1.Subject{
		{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "bob@example.com"},
		{Kind: rbacv1.SubjectKind_SUBJECT_KIND_GROUP, Name: `odd "group" <&>`},
		{Kind: rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT, Name: "ci", Namespace: "tools"},
		{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"},
	}
	cases := []struct{ project, namespace, template string }{
		{"team-a", "web", "pod-reader"},
		{"p", "ns-1", "x"},
		{"weird\"proj", "n\\s", "t<&>é"},
	}
	for _, tc := range cases {
		got := roleBindingObject(tc.project, tc.namespace, tc.template, marshalSubjects(subjects)).Manifest
		sorted := sortSubjects(subjects)
		rb := roleBinding{
			APIVersion: rbacGroup + "/v1", Kind: kindRoleBinding,
			Metadata: objectMeta{Name: ObjectName(tc.template), Namespace: tc.namespace,
				Labels: map[string]string{OwnerLabel: OwnerValue, TemplateLabel: tc.template, ProjectLabel: tc.project}},
			RoleRef: roleRef{APIGroup: rbacGroup, Kind: kindClusterRole, Name: ObjectName(tc.template)},
		}
		for _, s := range sorted {
			rb.Subjects = append(rb.Subjects, toK8sSubject(s))
		}
		want, err := json.Marshal(rb)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("hand-written\n%s\nencoding/json\n%s", got, want)
		}
	}
}
