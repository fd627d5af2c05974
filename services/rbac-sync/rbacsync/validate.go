package rbacsync

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

const (
	maxDisplayName = 256
	maxRules       = 256
	maxInherits    = 32
)

// validateTemplate checks a template's own fields; inherits are checked against the other
// templates by the caller (existence, cycles).
func validateTemplate(v *apierr.Violations, field string, t *rbacv1.RoleTemplate) {
	if t == nil {
		v.Add(field, "required")
		return
	}
	// A DNS label, so that `fleetstream:<name>` is a valid ClusterRole name and the name is a
	// valid label value.
	v.DNSLabel(field+".name", t.Name)
	if len(t.DisplayName) > maxDisplayName {
		v.Add(field+".display_name", "longer than %d bytes", maxDisplayName)
	}
	if len(t.Rules) == 0 && len(t.Inherits) == 0 {
		v.Add(field+".rules", "give at least one rule or inherited template")
	}
	if len(t.Rules) > maxRules {
		v.Add(field+".rules", "more than %d rules", maxRules)
	}
	for i, r := range t.Rules {
		validateRule(v, fmt.Sprintf("%s.rules[%d]", field, i), r)
	}
	if len(t.Inherits) > maxInherits {
		v.Add(field+".inherits", "more than %d templates", maxInherits)
	}
	seen := map[string]bool{}
	for i, p := range t.Inherits {
		f := fmt.Sprintf("%s.inherits[%d]", field, i)
		v.DNSLabel(f, p)
		if p == t.Name {
			v.Add(f, "a template cannot inherit itself")
		}
		if seen[p] {
			v.Add(f, "%q listed twice", p)
		}
		seen[p] = true
	}
}

// validateRule applies the rules Kubernetes applies to a ClusterRole's PolicyRule, so that no
// template can produce an object member clusters reject.
func validateRule(v *apierr.Violations, field string, r *rbacv1.PolicyRule) {
	if r == nil {
		v.Add(field, "required")
		return
	}
	if len(r.Verbs) == 0 {
		v.Add(field+".verbs", "required: at least one verb")
	}
	nonEmpty(v, field+".verbs", r.Verbs)
	nonEmpty(v, field+".resources", r.Resources)
	nonEmpty(v, field+".resource_names", r.ResourceNames)
	switch {
	case len(r.NonResourceUrls) > 0:
		if len(r.Resources) > 0 || len(r.ApiGroups) > 0 || len(r.ResourceNames) > 0 {
			v.Add(field+".non_resource_urls", "a rule applies either to resources or to non-resource URLs, not both")
		}
		for i, u := range r.NonResourceUrls {
			if !strings.HasPrefix(u, "/") && u != "*" {
				v.Add(fmt.Sprintf("%s.non_resource_urls[%d]", field, i), "%q: must start with /", u)
			}
		}
	case len(r.Resources) == 0:
		v.Add(field+".resources", "required: at least one resource (or non_resource_urls)")
	case len(r.ApiGroups) == 0:
		v.Add(field+".api_groups", `required: at least one API group ("" is the core group)`)
	}
}

func nonEmpty(v *apierr.Violations, field string, values []string) {
	for i, s := range values {
		if strings.TrimSpace(s) == "" {
			v.Add(fmt.Sprintf("%s[%d]", field, i), "empty")
		}
	}
}

// validateSubject checks a binding's subject the way Kubernetes checks a RoleBinding subject.
func validateSubject(v *apierr.Violations, field string, s *rbacv1.Subject) {
	if s == nil {
		v.Add(field, "required")
		return
	}
	switch s.Kind {
	case rbacv1.SubjectKind_SUBJECT_KIND_USER, rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		if strings.TrimSpace(s.Name) == "" {
			v.Add(field+".name", "required")
		}
		if s.Namespace != "" {
			v.Add(field+".namespace", "only a ServiceAccount has a namespace")
		}
	case rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT:
		if s.Name == "" {
			v.Add(field+".name", "required")
		} else {
			for _, msg := range validation.IsDNS1123Subdomain(s.Name) {
				v.Add(field+".name", "%q: %s", s.Name, msg)
			}
		}
		v.DNSLabel(field+".namespace", s.Namespace)
	default:
		v.Add(field+".kind", "required: USER, GROUP or SERVICE_ACCOUNT")
	}
	if len(s.Name) > 253 {
		v.Add(field+".name", "longer than 253 bytes")
	}
}
