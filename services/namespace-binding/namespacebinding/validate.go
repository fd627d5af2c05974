package namespacebinding

import (
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/protectedns"
)

const (
	maxDisplayName = 256
	maxHardEntries = 64
)

// validateHard checks quota limits: resource names as Kubernetes qualified names (cpu,
// requests.memory, count/deployments.apps) and values as non-negative quantities.
func validateHard(v *apierr.Violations, field string, hard map[string]string) {
	if len(hard) > maxHardEntries {
		v.Add(field, "at most %d resources", maxHardEntries)
	}
	names := make([]string, 0, len(hard))
	for k := range hard {
		names = append(names, k)
	}
	sort.Strings(names) // deterministic messages
	for _, k := range names {
		f := fmt.Sprintf("%s[%q]", field, k)
		for _, msg := range validation.IsQualifiedName(k) {
			v.Add(f, "resource name: %s", msg)
		}
		q, err := resource.ParseQuantity(hard[k])
		if err != nil {
			v.Add(f, "%q is not a quantity: %v", hard[k], err)
			continue
		}
		if q.Sign() < 0 {
			v.Add(f, "%q: must not be negative", hard[k])
		}
	}
}

// validateTarget checks the (project, cluster, namespace) every binding request names.
func validateTarget(v *apierr.Violations, project, cluster, namespace string) {
	v.DNSLabel("project", project)
	v.DNSLabel("cluster", cluster)
	v.DNSLabel("namespace", namespace)
}

// validateUnprotected refuses a namespace that is never a project's (Config.Protected): the
// cluster's own (kube-system holds its control plane's Secrets and ServiceAccounts) and
// Fleetstream's (the agent's ServiceAccount writes RBAC). Every path that ends in a binding
// checks it: a direct bind, a namespace following a placement, and bind itself, which also
// refuses what a follower recorded before the namespace became protected.
func validateUnprotected(v *apierr.Violations, protected protectedns.List, field, namespace string) {
	if reason := protected.Reason(namespace); reason != "" {
		v.Add(field, "%s: it belongs to the cluster or to Fleetstream, never to a project", reason)
	}
}

func validatePolicy(v *apierr.Violations, field string, p projectv1.UnbindPolicy) {
	if _, ok := projectv1.UnbindPolicy_name[int32(p)]; !ok {
		v.Add(field, "unknown policy %d: KEEP or DELETE", p)
	}
}

func validateProjectMeta(v *apierr.Violations, displayName string, labels map[string]string) {
	if len(displayName) > maxDisplayName {
		v.Add("display_name", "longer than %d bytes", maxDisplayName)
	}
	v.Labels("labels", labels)
}
