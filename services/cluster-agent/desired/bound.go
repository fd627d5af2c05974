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
	"k8s.io/client-go/tools/cache"

	"github.com/fleetstream/fleetstream/pkg/mcs"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// ReasonNamespaceNotBound: a desired object of a bucket whose objects live only in bound
// namespaces (desired-mcs) names a namespace this agent has not bound to the object's project.
const ReasonNamespaceNotBound = "NamespaceNotBound"

// boundOnly are the desired buckets whose objects go only into namespaces this agent bound for
// their project (owner label fleetstream.io/project): a multi-cluster Service's import and
// endpoints are the project's, and the agent does not take the hub's word that the namespace is.
var boundOnly = map[string]bool{subjects.DesiredMCSBucket: true}

// ReasonNotAllowed: a desired object of a bucket restricted to some kinds (desired-mcs) is of
// another kind, its key names another kind than its manifest, or it breaks the bucket's label
// rules. It is never applied.
const ReasonNotAllowed = "NotAllowed"

var (
	serviceImportKind = schema.GroupKind{Group: "multicluster.x-k8s.io", Kind: "ServiceImport"}
	endpointSliceKind = schema.GroupKind{Group: "discovery.k8s.io", Kind: "EndpointSlice"}
)

// bucketKinds are the only kinds the restricted buckets may carry. The writer of desired-mcs
// (endpoint-collector) reads untrusted agent input; were it compromised, it must not reach
// RBAC, quotas or anything else through this bucket, which NATS alone does not prevent.
var bucketKinds = map[string]map[schema.GroupKind]bool{
	subjects.DesiredMCSBucket: {serviceImportKind: true, endpointSliceKind: true},
}

// notAllowed says why manifest u of entry e (key target t) may not be applied at all, empty
// when it may.
func notAllowed(e entry, t keyTarget, u *unstructured.Unstructured) string {
	kinds, restricted := bucketKinds[e.bucket]
	if !restricted {
		return ""
	}
	gk := u.GroupVersionKind().GroupKind()
	if !kinds[gk] {
		return fmt.Sprintf("%s: kind %s is not allowed in %s (only ServiceImport.multicluster.x-k8s.io and EndpointSlice.discovery.k8s.io)", e.key, gk, e.bucket)
	}
	if t.kind != gk {
		return fmt.Sprintf("%s: the key names kind %s, the manifest %s", e.key, t.kind, gk)
	}
	if gk == endpointSliceKind {
		l := u.GetLabels()
		if l[mcs.SliceManagedByLabel] != mcs.SliceManager {
			return fmt.Sprintf("%s: metadata.labels[%s] must be %q", e.key, mcs.SliceManagedByLabel, mcs.SliceManager)
		}
		// kube-proxy and cluster DNS serve a slice with this label as the endpoints of the
		// local Service it names: an imported slice carrying it would redirect that Service.
		if _, ok := l[mcs.LocalServiceLabel]; ok {
			return fmt.Sprintf("%s: metadata.labels[%s] is not allowed on an imported EndpointSlice", e.key, mcs.LocalServiceLabel)
		}
	}
	return ""
}

var namespaceGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// notBound says why entry e may not be applied into namespace, empty when it may: the
// namespace must be one this agent manages, labelled with the entry's project.
func (a *Applier) notBound(ctx context.Context, e entry, namespace string) (string, error) {
	if !boundOnly[e.bucket] {
		return "", nil
	}
	project := e.obj.GetOwnerLabelValue()
	if e.obj.GetOwnerLabelKey() != mcs.ProjectLabel || project == "" {
		return fmt.Sprintf("desired objects of %s must name their project (owner label %s)", e.bucket, mcs.ProjectLabel), nil
	}
	if namespace == "" {
		return fmt.Sprintf("desired objects of %s must be namespaced", e.bucket), nil
	}
	// The Namespace informer caches exactly the managed namespaces: a miss there is a namespace
	// this agent did not bind, with no API call.
	ns, synced := a.informers.lookup(namespaceGVR, "", namespace)
	if !synced {
		var err error
		ns, err = a.dyn.Resource(namespaceGVR).Get(ctx, namespace, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			ns = nil
		case err != nil:
			return "", fmt.Errorf("get namespace %s: %w", namespace, err)
		}
	}
	if ns == nil {
		return fmt.Sprintf("namespace %s is not bound to project %s on this cluster", namespace, project), nil
	}
	l := ns.GetLabels()
	if l[ManagedByLabel] != ManagedByValue || l[mcs.ProjectLabel] != project || ns.GetDeletionTimestamp() != nil {
		return fmt.Sprintf("namespace %s is not bound to project %s on this cluster", namespace, project), nil
	}
	return "", nil
}

// refuseNotBound reports e Failed (NamespaceNotBound) instead of applying it, and deletes what
// an earlier apply of the same key made (the namespace was bound then). It returns an error so
// that the key is tried again with backoff: a binding on its way makes the namespace bound.
func (a *Applier) refuseNotBound(ctx context.Context, e entry, mapping *meta.RESTMapping, ri dynamic.ResourceInterface, namespace, name, reason string) error {
	qk := queueKey(e.bucket, e.key)
	a.setMark(qk, appliedMark{})
	live, err := a.liveObject(ctx, mapping, ri, namespace, name, qk)
	if err != nil {
		return err
	}
	if live != nil && managedFor(live, qk) {
		if err := deleteObject(ctx, ri, live); err != nil {
			return err
		}
		a.log.Warn("deleted an object applied into a namespace no longer bound", zap.String("key", qk), zap.String("namespace", namespace), zap.String("name", name))
	}
	if err := a.fail(ctx, e, ReasonNamespaceNotBound, reason); err != nil {
		return err
	}
	return fmt.Errorf("%s: %s", qk, reason)
}

// namespaceChanged queues the keys of boundOnly buckets in a managed Namespace that changed
// (bound, released, relabelled): an object refused as not bound is applied once its namespace
// is, without waiting for its backoff, and one whose namespace was released is removed.
func (a *Applier) namespaceChanged(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GetKind() != "Namespace" || u.GetNamespace() != "" {
		return
	}
	for b := range boundOnly {
		for _, e := range a.store.list(b) {
			if t, err := parseDesiredKey(e.key); err == nil && t.namespace == u.GetName() {
				a.queue.Add(queueKey(b, e.key))
			}
		}
	}
}
