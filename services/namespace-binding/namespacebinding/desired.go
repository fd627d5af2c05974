package namespacebinding

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// What namespace-binding puts on member clusters.
const (
	// ProjectLabel marks a namespace (and its quota) as owned by a project. It is the ownership
	// guard of the desired objects: the agent refuses to touch a namespace labelled for another
	// project (reason OwnedByOther) and adopts one without the label.
	ProjectLabel = "fleetstream.io/project"
	// QuotaName is the ResourceQuota each binding with hard limits gets in its namespace.
	QuotaName = "fleetstream-quota"
	// owner identifies this service in DesiredObject.owner.
	owner = "namespace-binding"

	kindNamespace     = "Namespace"
	kindResourceQuota = "ResourceQuota"
)

func namespaceDesiredKey(cluster, namespace string) string {
	return subjects.DesiredKey(cluster, kindNamespace, "", namespace)
}

func quotaDesiredKey(cluster, namespace string) string {
	return subjects.DesiredKey(cluster, kindResourceQuota, namespace, QuotaName)
}

func appliedKey(desiredKey string) string {
	return subjects.AppliedKey(subjects.DesiredNamespacesBucket, desiredKey)
}

type objectMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

type namespaceManifest struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
}

type quotaManifest struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Hard map[string]string `json:"hard"`
	} `json:"spec"`
}

// namespaceObject is the desired Namespace of a binding. encoding/json sorts map keys, so the
// same binding always renders the same bytes: readers compare manifests to tell whether the
// desired state already reflects a binding.
func namespaceObject(project, namespace string) *desiredv1.DesiredObject {
	data, _ := json.Marshal(namespaceManifest{APIVersion: "v1", Kind: kindNamespace,
		Metadata: objectMeta{Name: namespace, Labels: map[string]string{ProjectLabel: project}}})
	return &desiredv1.DesiredObject{Manifest: data, OwnerLabelKey: ProjectLabel, OwnerLabelValue: project, Owner: owner}
}

// quotaObject is the desired ResourceQuota of a binding; the agent reports its status (hard
// and used) back, which the project status sums.
func quotaObject(project, namespace string, hard map[string]string) *desiredv1.DesiredObject {
	m := quotaManifest{APIVersion: "v1", Kind: kindResourceQuota,
		Metadata: objectMeta{Name: QuotaName, Namespace: namespace, Labels: map[string]string{ProjectLabel: project}}}
	m.Spec.Hard = canonicalHard(hard)
	data, _ := json.Marshal(m)
	return &desiredv1.DesiredObject{Manifest: data, OwnerLabelKey: ProjectLabel, OwnerLabelValue: project, Owner: owner, ReportStatus: true}
}

// tombstone says an object must go. The owner guard stays so the agent never deletes a
// namespace that has since been labelled for another project.
func tombstone(project string, policy desiredv1.DeletionPolicy) *desiredv1.DesiredObject {
	return &desiredv1.DesiredObject{Tombstone: true, DeletionPolicy: policy, OwnerLabelKey: ProjectLabel, OwnerLabelValue: project, Owner: owner}
}

func deletionPolicy(p projectv1.UnbindPolicy) desiredv1.DeletionPolicy {
	if p == projectv1.UnbindPolicy_UNBIND_POLICY_DELETE {
		return desiredv1.DeletionPolicy_DELETION_POLICY_DELETE
	}
	return desiredv1.DeletionPolicy_DELETION_POLICY_ORPHAN
}

// canonicalHard rewrites validated quantities in canonical form ("1000m" → "1"), so equal
// limits compare and render equal.
func canonicalHard(hard map[string]string) map[string]string {
	out := make(map[string]string, len(hard))
	for k, v := range hard {
		if q, err := resource.ParseQuantity(v); err == nil {
			out[k] = q.String()
		} else {
			out[k] = v
		}
	}
	return out
}

// quotaStatus is the part of a ResourceQuota's status the agent reports back.
type quotaStatus struct {
	Hard map[string]string `json:"hard"`
	Used map[string]string `json:"used"`
}

func parseQuotaStatus(data []byte) (quotaStatus, error) {
	var st quotaStatus
	if len(data) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("decode quota status: %w", err)
	}
	return st, nil
}
