package desired

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// An agent never takes the hub's word for which namespaces a project may have: the protected
// ones (Config.Protected: kube-*, default, Fleetstream's own and whatever the cluster's admin
// adds) are never adopted, labelled, given a quota or role-bound, even when desired state asks,
// as a compromised or misconfigured hub could. A project owning kube-system would read the
// cluster's Secrets and act as its controllers' ServiceAccounts: cluster-admin.

// protected says why the object (kind gk, in namespace, named name) is off limits; empty when
// it is not. A Namespace is judged by its name, a namespaced object by its namespace.
func (a *Applier) protected(gk schema.GroupKind, namespace, name string) string {
	if gk.Group == "" && gk.Kind == "Namespace" {
		return a.cfg.Protected.Reason(name)
	}
	if namespace == "" {
		return "" // cluster-scoped: ClusterRoles
	}
	return a.cfg.Protected.Reason(namespace)
}

// refuseProtected reports e Failed (ProtectedNamespace) instead of applying it (or, for a
// tombstone deleting a protected Namespace, instead of deleting it). What an earlier
// agent applied for the same key (one that did not protect the namespace yet) is undone first,
// the way a tombstone would: a Namespace is released, so its project label goes and it stays;
// anything in one is deleted. Only objects carrying this key's marks are touched.
func (a *Applier) refuseProtected(ctx context.Context, e entry, mapping *meta.RESTMapping, ri dynamic.ResourceInterface, namespace, name, reason string) error {
	qk := queueKey(e.bucket, e.key)
	a.setMark(qk, appliedMark{})
	live, err := a.liveObject(ctx, mapping, ri, namespace, name, qk)
	if err != nil {
		return err
	}
	if live != nil && managedFor(live, qk) {
		if isNamespace(mapping.GroupVersionKind) {
			if err := a.release(ctx, ri, mapping.GroupVersionKind, live); err != nil {
				return err
			}
		} else if err := deleteObject(ctx, ri, live); err != nil {
			return err
		}
		a.log.Warn("undid an earlier apply in a protected namespace", zap.String("key", qk), zap.String("resource", mapping.Resource.Resource),
			zap.String("namespace", namespace), zap.String("name", name))
	}
	a.log.Warn("refused desired state in a protected namespace: the hub asked for what no project may have",
		zap.String("key", qk), zap.String("reason", reason))
	return a.fail(ctx, e, ReasonProtectedNamespace, "namespace "+reason+" on this cluster: the agent never adopts, labels, quotas, binds or deletes it")
}

// liveObject is the object (namespace, name) as the informer holds it, read from the cluster
// when the informer does not hold it yet; nil when it does not exist.
func (a *Applier) liveObject(ctx context.Context, mapping *meta.RESTMapping, ri dynamic.ResourceInterface, namespace, name, qk string) (*unstructured.Unstructured, error) {
	live, cached := a.informers.cached(mapping.Resource, namespace, name, qk)
	if cached {
		return live, nil
	}
	live, err := ri.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get %s %s: %w", mapping.Resource.Resource, name, err)
	}
	return live, nil
}
