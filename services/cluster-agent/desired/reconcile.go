package desired

import (
	"context"
	"encoding/json"
	"fmt"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
)

// reconcile brings the object of one desired key in line with its latest entry. An error
// requeues the key with backoff; outcomes that only a change of desired state or of the live
// object can fix (an invalid manifest, another owner) are reported and return nil.
func (a *Applier) reconcile(ctx context.Context, qk string) error {
	bucket, key, _ := splitQueueKey(qk)
	if key == sweepKey {
		return a.sweep(ctx, bucket)
	}
	if !a.ours(qk) {
		return nil
	}
	e, ok := a.store.get(qk)
	switch {
	case !ok:
		// Absence means "no longer desired" only once the bucket's replay is complete;
		// before that, the key may simply not have been delivered yet.
		if !a.store.isSynced(bucket) {
			return nil
		}
		return a.prune(ctx, bucket, key)
	case e.decodeErr != nil:
		return a.fail(ctx, e, ReasonInvalidObject, e.decodeErr.Error())
	case e.obj.GetTombstone():
		return a.removeTombstoned(ctx, e)
	default:
		return a.apply(ctx, e)
	}
}

// apply server-side applies the entry's manifest, guarded by the ownership label.
func (a *Applier) apply(ctx context.Context, e entry) error {
	qk := queueKey(e.bucket, e.key)
	u, err := decodeManifest(e.obj.GetManifest())
	if err != nil {
		return a.fail(ctx, e, ReasonInvalidObject, err.Error())
	}
	target, err := parseDesiredKey(e.key)
	if err != nil {
		return a.fail(ctx, e, ReasonInvalidObject, err.Error())
	}
	// A manifest naming another object than its key would let two keys fight over one object.
	if u.GetName() != target.name {
		return a.fail(ctx, e, ReasonInvalidObject, fmt.Sprintf("manifest names %q, key names %q", u.GetName(), target.name))
	}
	if reason := notAllowed(e, target, u); reason != "" {
		// Only a change of the desired object can fix this: report, do not retry.
		return a.fail(ctx, e, ReasonNotAllowed, reason)
	}
	gvk := u.GroupVersionKind()
	mapping, err := a.resolver.mapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		// A CRD may be installed later: keep retrying with backoff.
		_ = a.fail(ctx, e, ReasonUnknownKind, err.Error())
		return err
	}
	namespaced := mapping.Scope.Name() == meta.RESTScopeNameNamespace
	if !namespaced {
		u.SetNamespace("")
	}
	if u.GetNamespace() != target.namespace {
		return a.fail(ctx, e, ReasonInvalidObject, fmt.Sprintf("manifest namespace %q, key namespace %q", u.GetNamespace(), target.namespace))
	}
	if err := a.informers.ensure(ctx, mapping.Resource); err != nil {
		return err
	}
	ri := resourceClient(a.dyn, mapping, u.GetNamespace())
	if reason := a.protected(gvk.GroupKind(), u.GetNamespace(), u.GetName()); reason != "" {
		return a.refuseProtected(ctx, e, mapping, ri, u.GetNamespace(), u.GetName(), reason)
	}
	if reason, err := a.notBound(ctx, e, u.GetNamespace()); err != nil {
		return err
	} else if reason != "" {
		return a.refuseNotBound(ctx, e, mapping, ri, u.GetNamespace(), u.GetName(), reason)
	}

	live, cached := a.informers.cached(mapping.Resource, u.GetNamespace(), u.GetName(), qk)
	if !cached {
		live, err = ri.Get(ctx, u.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			live = nil
		case err != nil:
			_ = a.fail(ctx, e, ReasonApplyFailed, fmt.Sprintf("get live object: %v", err))
			return fmt.Errorf("get %s %s: %w", mapping.Resource.Resource, u.GetName(), err)
		}
	}
	if live != nil {
		if reason, msg := a.guard(e, qk, live); reason != "" {
			return a.fail(ctx, e, reason, msg)
		}
		if live.GetDeletionTimestamp() != nil {
			// Its deletion event queues the key again, and the object is then recreated.
			return a.fail(ctx, e, ReasonTerminating, "the live object is being deleted; it is recreated once gone")
		}
		if m, ok := a.mark(qk); ok && m.desiredRevision == e.revision && m.resourceVersion == live.GetResourceVersion() {
			// Nothing changed since our own apply: this is its echo.
			return a.reportApplied(ctx, e, live)
		}
		// The resourceVersion makes the apply conditional: if another writer changes the
		// object (e.g. labels it for another owner) after the guard looked, the apply fails
		// with a conflict and the key is reconciled again.
		u.SetResourceVersion(live.GetResourceVersion())
	}
	markManaged(u, qk, e.obj)
	data, err := json.Marshal(u.Object)
	if err != nil {
		return a.fail(ctx, e, ReasonInvalidObject, err.Error())
	}
	force := true
	res, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
	if err != nil {
		if !apierrors.IsConflict(err) {
			_ = a.fail(ctx, e, ReasonApplyFailed, err.Error())
		}
		return fmt.Errorf("apply %s %s: %w", mapping.Resource.Resource, u.GetName(), err)
	}
	a.setMark(qk, appliedMark{desiredRevision: e.revision, resourceVersion: res.GetResourceVersion()})
	if live == nil {
		a.log.Info("created", zap.String("key", qk), zap.String("resource", mapping.Resource.Resource), zap.String("name", u.GetName()))
	}
	return a.reportApplied(ctx, e, res)
}

// guard returns a failure reason when the live object is not ours to apply.
func (a *Applier) guard(e entry, qk string, live *unstructured.Unstructured) (reason, msg string) {
	labels := live.GetLabels()
	if k := e.obj.GetOwnerLabelKey(); k != "" {
		if v, ok := labels[k]; ok && v != e.obj.GetOwnerLabelValue() {
			return ReasonOwnedByOther, fmt.Sprintf("%s is labelled %s=%s: owned by %q, not %q", live.GetName(), k, v, v, e.obj.GetOwnerLabelValue())
		}
	}
	// Two desired keys naming one object would flap; the one that applied first keeps it
	// while its key exists.
	if labels[ManagedByLabel] == ManagedByValue {
		if other := live.GetAnnotations()[DesiredKeyAnnotation]; other != "" && other != qk && a.store.has(other) {
			return ReasonManagedByOtherKey, fmt.Sprintf("%s is already managed for desired key %s", live.GetName(), other)
		}
	}
	return "", ""
}

// reportApplied reports success, with the live status when the desired object asks for it.
func (a *Applier) reportApplied(ctx context.Context, e entry, live *unstructured.Unstructured) error {
	st := &desiredv1.AppliedStatus{DesiredRevision: e.revision, Phase: desiredv1.Phase_PHASE_APPLIED, Reason: ReasonApplied}
	if e.obj.GetReportStatus() {
		if s, ok := live.Object["status"]; ok && s != nil {
			data, err := json.Marshal(s)
			if err != nil {
				return fmt.Errorf("encode status: %w", err)
			}
			st.StatusJson = data
		}
	}
	return a.status.report(ctx, e.bucket, e.key, st)
}

// fail reports a failure of e; it returns the report's own error so that a status that could
// not be written is retried.
func (a *Applier) fail(ctx context.Context, e entry, reason, msg string) error {
	a.log.Info("desired object not applied", zap.String("key", queueKey(e.bucket, e.key)), zap.String("reason", reason), zap.String("message", msg))
	return a.status.report(ctx, e.bucket, e.key, &desiredv1.AppliedStatus{
		DesiredRevision: e.revision, Phase: desiredv1.Phase_PHASE_FAILED, Reason: reason, Message: msg,
	})
}

func (a *Applier) mark(qk string) (appliedMark, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, ok := a.applied[qk]
	return m, ok
}

func (a *Applier) setMark(qk string, m appliedMark) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m == (appliedMark{}) {
		delete(a.applied, qk)
		return
	}
	a.applied[qk] = m
}

// decodeManifest parses a manifest and checks it names an object.
func decodeManifest(data []byte) (*unstructured.Unstructured, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("empty manifest")
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if u.GetName() == "" {
		return nil, fmt.Errorf("manifest has no metadata.name")
	}
	// Server-owned metadata in a manifest would break the apply (uid, resourceVersion) or
	// fight the server (managedFields).
	u.SetUID("")
	u.SetResourceVersion("")
	u.SetManagedFields(nil)
	u.SetCreationTimestamp(metav1.Time{})
	return u, nil
}

// markManaged adds the managed-by label, the desired-key annotation and the owner label.
func markManaged(u *unstructured.Unstructured, qk string, obj *desiredv1.DesiredObject) {
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[ManagedByLabel] = ManagedByValue
	if k := obj.GetOwnerLabelKey(); k != "" {
		labels[k] = obj.GetOwnerLabelValue()
	}
	u.SetLabels(labels)
	ann := u.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[DesiredKeyAnnotation] = qk
	u.SetAnnotations(ann)
}

func resourceClient(dyn dynamic.Interface, m *meta.RESTMapping, namespace string) dynamic.ResourceInterface {
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return dyn.Resource(m.Resource).Namespace(namespace)
	}
	return dyn.Resource(m.Resource)
}
