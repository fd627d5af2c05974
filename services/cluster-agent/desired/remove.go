package desired

import (
	"context"
	"encoding/json"
	"fmt"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
)

// releaseFieldManager removes the managed-by marks when another manager co-owns them, so the
// empty apply could not; a separate name keeps FieldManager's apply ownership untouched.
const releaseFieldManager = "fleetstream-agent-release"

// removeTombstoned deletes or releases the object a tombstone names, if it is ours.
func (a *Applier) removeTombstoned(ctx context.Context, e entry) error {
	qk := queueKey(e.bucket, e.key)
	orphan := e.obj.GetDeletionPolicy() == desiredv1.DeletionPolicy_DELETION_POLICY_ORPHAN
	gone := ReasonDeleted
	if orphan {
		gone = ReasonReleased
	}
	target, err := a.tombstoneTarget(e)
	if err != nil {
		return a.fail(ctx, e, ReasonInvalidObject, err.Error())
	}
	mapping, err := a.resolver.mapping(target.kind, "")
	if err != nil {
		_ = a.fail(ctx, e, ReasonUnknownKind, err.Error())
		return err
	}
	// The informer delivers the deletion, which reports the object absent.
	if err := a.informers.ensure(ctx, mapping.Resource); err != nil {
		return err
	}
	ri := resourceClient(a.dyn, mapping, target.namespace)
	// Releasing, or deleting what this key applied inside a protected namespace, only takes
	// back what a project was given; a protected namespace itself is released, never deleted.
	if reason := a.protected(target.kind, target.namespace, target.name); reason != "" && !orphan && isNamespace(mapping.GroupVersionKind) {
		return a.refuseProtected(ctx, e, mapping, ri, target.namespace, target.name, reason)
	}
	live, cached := a.informers.cached(mapping.Resource, target.namespace, target.name, qk)
	if !cached {
		live, err = ri.Get(ctx, target.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			a.setMark(qk, appliedMark{})
			return a.reportRemoved(ctx, e, gone, true, "")
		}
		if err != nil {
			return fmt.Errorf("get %s %s: %w", mapping.Resource.Resource, target.name, err)
		}
	}
	if k := e.obj.GetOwnerLabelKey(); k != "" {
		if v, ok := live.GetLabels()[k]; ok && v != e.obj.GetOwnerLabelValue() {
			return a.fail(ctx, e, ReasonOwnedByOther, fmt.Sprintf("%s is labelled %s=%s: owned by %q; left in place", target.name, k, v, v))
		}
	}
	if !managedFor(live, qk) {
		if orphan {
			// Released, by us earlier or never managed: either way the end state ORPHAN asks for.
			return a.reportRemoved(ctx, e, ReasonReleased, false, "")
		}
		return a.reportRemoved(ctx, e, ReasonNotManaged, false, fmt.Sprintf("%s exists but is not managed for this key; left in place", target.name))
	}
	a.setMark(qk, appliedMark{})
	if orphan {
		if err := a.release(ctx, ri, mapping.GroupVersionKind, live); err != nil {
			return err
		}
		a.log.Info("released", zap.String("key", qk), zap.String("resource", mapping.Resource.Resource), zap.String("name", target.name))
		return a.reportRemoved(ctx, e, ReasonReleased, false, "")
	}
	if live.GetDeletionTimestamp() == nil {
		if err := deleteObject(ctx, ri, live); err != nil {
			_ = a.fail(ctx, e, ReasonDeleteFailed, err.Error())
			return err
		}
		a.log.Info("deleted", zap.String("key", qk), zap.String("resource", mapping.Resource.Resource), zap.String("name", target.name))
	}
	// Finalizers may keep it a while (a namespace's contents); its deletion event reports it
	// absent.
	return a.reportRemoved(ctx, e, ReasonDeleting, false, "")
}

// tombstoneTarget names the object of a tombstone: from its manifest if it carries one,
// otherwise from its key.
func (a *Applier) tombstoneTarget(e entry) (keyTarget, error) {
	if len(e.obj.GetManifest()) > 0 {
		if u, err := decodeManifest(e.obj.GetManifest()); err == nil {
			return keyTarget{kind: u.GroupVersionKind().GroupKind(), namespace: u.GetNamespace(), name: u.GetName()}, nil
		}
	}
	return parseDesiredKey(e.key)
}

func (a *Applier) reportRemoved(ctx context.Context, e entry, reason string, absent bool, msg string) error {
	return a.status.report(ctx, e.bucket, e.key, &desiredv1.AppliedStatus{
		DesiredRevision: e.revision, Phase: desiredv1.Phase_PHASE_APPLIED, Reason: reason, Message: msg, Absent: absent,
	})
}

// prune removes the managed objects of a key that is no longer in desired state and drops its
// status.
//
// Namespaces are released, never deleted, by prune: deleting a namespace deletes every workload
// in it, and a key can vanish for reasons that say nothing about the workloads (a bucket
// rebuilt, an owner service's bug, a binding moved). Only an explicit tombstone with
// DELETION_POLICY_DELETE deletes a namespace.
func (a *Applier) prune(ctx context.Context, bucket, key string) error {
	qk := queueKey(bucket, key)
	objs, err := a.informers.byKey(qk)
	if err != nil {
		return err
	}
	for _, mo := range objs {
		gvk, err := a.kindOf(mo)
		if err != nil {
			return err
		}
		var rc dynamic.ResourceInterface = a.dyn.Resource(mo.gvr)
		if ns := mo.obj.GetNamespace(); ns != "" {
			rc = a.dyn.Resource(mo.gvr).Namespace(ns)
		}
		if isNamespace(gvk) {
			if err := a.release(ctx, rc, gvk, mo.obj); err != nil {
				return err
			}
			a.log.Info("released no longer desired namespace", zap.String("key", qk), zap.String("name", mo.obj.GetName()))
			continue
		}
		if err := deleteObject(ctx, rc, mo.obj); err != nil {
			return err
		}
		a.log.Info("pruned", zap.String("key", qk), zap.String("resource", mo.gvr.Resource), zap.String("namespace", mo.obj.GetNamespace()), zap.String("name", mo.obj.GetName()))
	}
	a.setMark(qk, appliedMark{})
	return a.status.forget(ctx, bucket, key)
}

// release stops managing live: an empty apply by FieldManager removes every field it applied
// (labels, spec...) that no other manager also owns, and the object stays.
func (a *Applier) release(ctx context.Context, ri dynamic.ResourceInterface, gvk schema.GroupVersionKind, live *unstructured.Unstructured) error {
	empty := &unstructured.Unstructured{}
	empty.SetGroupVersionKind(gvk)
	empty.SetName(live.GetName())
	empty.SetNamespace(live.GetNamespace())
	// Conditional on the version we judged "ours", like apply.
	empty.SetResourceVersion(live.GetResourceVersion())
	data, err := json.Marshal(empty.Object)
	if err != nil {
		return fmt.Errorf("encode release: %w", err)
	}
	force := true
	res, err := ri.Patch(ctx, live.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release %s %s: %w", gvk.Kind, live.GetName(), err)
	}
	_, labelled := res.GetLabels()[ManagedByLabel]
	_, annotated := res.GetAnnotations()[DesiredKeyAnnotation]
	if !labelled && !annotated {
		return nil
	}
	patch := map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{ManagedByLabel: nil},
		"annotations": map[string]any{DesiredKeyAnnotation: nil},
	}}
	data, err = json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encode release patch: %w", err)
	}
	if _, err := ri.Patch(ctx, live.GetName(), types.MergePatchType, data, metav1.PatchOptions{FieldManager: releaseFieldManager}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove managed-by marks of %s %s: %w", gvk.Kind, live.GetName(), err)
	}
	return nil
}

// deleteObject deletes live, but not a newer object of the same name created since.
func deleteObject(ctx context.Context, ri dynamic.ResourceInterface, live *unstructured.Unstructured) error {
	uid := live.GetUID()
	policy := metav1.DeletePropagationBackground
	err := ri.Delete(ctx, live.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}, PropagationPolicy: &policy})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s: %w", live.GetName(), err)
	}
	return nil
}

// managedFor reports whether live carries our marks for desired key qk.
func managedFor(live *unstructured.Unstructured, qk string) bool {
	return live.GetLabels()[ManagedByLabel] == ManagedByValue && live.GetAnnotations()[DesiredKeyAnnotation] == qk
}

// kindOf returns the kind of a cached object; list items may lack apiVersion and kind.
func (a *Applier) kindOf(mo managedObject) (schema.GroupVersionKind, error) {
	if gvk := mo.obj.GroupVersionKind(); gvk.Kind != "" && gvk.Version != "" {
		return gvk, nil
	}
	gvk, err := a.resolver.mapper.KindFor(mo.gvr)
	if err != nil {
		return schema.GroupVersionKind{}, fmt.Errorf("kind of %s: %w", mo.gvr, err)
	}
	return gvk, nil
}

func isNamespace(gvk schema.GroupVersionKind) bool {
	return gvk.Group == "" && gvk.Kind == "Namespace"
}
