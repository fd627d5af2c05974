package kubebridge

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/fleetstream/fleetstream/services/kube-bridge/crds"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRDs creates each CRD the bridge writes objects of, if it is missing, and waits until
// the hub serves it. A CRD that exists (installed by OCM, say, or an admin) is left as it is:
// the bridge writes only fields both the upstream schema and any later one have.
func (b *Bridge) installCRDs(ctx context.Context) error {
	if b.in != nil {
		// The bridge's own CRDs are applied as they are in this binary: an upgrade brings
		// their schema along.
		for _, doc := range crds.Fleetstream() {
			crd := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(doc, &crd.Object); err != nil {
				return fmt.Errorf("decode CRD: %w", err)
			}
			if _, err := b.dyn.Resource(crdGVR).Apply(ctx, crd.GetName(), crd, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
				return fmt.Errorf("apply CRD %s: %w", crd.GetName(), err)
			}
			if err := b.waitEstablished(ctx, crd.GetName()); err != nil {
				return err
			}
		}
	}
	for _, doc := range crds.All() {
		crd := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &crd.Object); err != nil {
			return fmt.Errorf("decode CRD: %w", err) // a build defect: every retry fails alike
		}
		_, err := b.dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		switch {
		case isNotFound(err):
			if _, err := b.dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{FieldManager: FieldManager}); err != nil && !isAlreadyExists(err) {
				return fmt.Errorf("create CRD %s: %w", crd.GetName(), err)
			}
			b.log.Info("installed CRD " + crd.GetName())
		case err != nil:
			return fmt.Errorf("get CRD %s: %w", crd.GetName(), err)
		}
		if err := b.waitEstablished(ctx, crd.GetName()); err != nil {
			return err
		}
	}
	return nil
}

// waitEstablished waits (at most 30 s) until the CRD's Established condition is True.
func (b *Bridge) waitEstablished(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		crd, err := b.dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established: %w", name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// apply server-side applies obj's metadata and everything but its status, then (if status)
// its status through the status subresource, both as FieldManager, forcing: the bridge is the
// one writer of these fields, and a field someone else set on them is put back (drift). It
// returns the object as the hub has it after the first apply.
func (b *Bridge) apply(ctx context.Context, gvr schema.GroupVersionResource, obj any, withStatus bool) (*unstructured.Unstructured, error) {
	m, err := toMap(obj)
	if err != nil {
		return nil, err
	}
	b.applies.Add(1)
	u := &unstructured.Unstructured{Object: m}
	status, hasStatus := m["status"]
	delete(m, "status")
	ri := b.dyn.Resource(gvr).Namespace(u.GetNamespace())
	opts := metav1.ApplyOptions{FieldManager: FieldManager, Force: true}
	got, err := ri.Apply(ctx, u.GetName(), u, opts)
	if err != nil {
		return nil, fmt.Errorf("apply %s %s/%s: %w", gvk(gvr), u.GetNamespace(), u.GetName(), err)
	}
	if !withStatus || !hasStatus {
		return got, nil
	}
	su := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(),
		"metadata": map[string]any{"name": u.GetName(), "namespace": u.GetNamespace()},
		"status":   status,
	}}
	if _, err := ri.ApplyStatus(ctx, u.GetName(), su, opts); err != nil {
		return nil, fmt.Errorf("apply status of %s %s/%s: %w", gvk(gvr), u.GetNamespace(), u.GetName(), err)
	}
	return got, nil
}

// remove deletes the object the bridge wrote, if it is still the one with uid.
func (b *Bridge) remove(ctx context.Context, gvr schema.GroupVersionResource, namespace, name string, uid types.UID) error {
	err := b.dyn.Resource(gvr).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !isNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete %s %s/%s: %w", gvk(gvr), namespace, name, err)
	}
	return nil
}

// toMap turns a typed object into what an apply sends: its JSON, without the nulls that a zero
// time or an empty map of a typed struct marshal to (an apply would read them as "remove").
func toMap(obj any) (map[string]any, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	dropNulls(m)
	return m, nil
}

func dropNulls(v any) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if e == nil {
				delete(t, k)
				continue
			}
			dropNulls(e)
		}
	case []any:
		for _, e := range t {
			dropNulls(e)
		}
	}
}

// upToDate reports whether existing already is what applying desired (toMap's) would make it:
// the labels the bridge's apply owns are exactly desired's, with desired's values, and every
// other top-level field of desired (spec, status) is equal. Then a reconcile writes nothing: a
// resync of a large fleet, or the informer's echo of the bridge's own write, costs no request.
// A false negative (someone else's extra status field, a list order) only costs an apply.
func upToDate(existing *unstructured.Unstructured, desired map[string]any) bool {
	want := (&unstructured.Unstructured{Object: desired}).GetLabels()
	owned, ok := appliedLabels(existing)
	if !ok || len(owned) != len(want) {
		return false
	}
	have := existing.GetLabels()
	for k, v := range want {
		if !owned[k] {
			return false
		}
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	for k, v := range desired {
		if k == "apiVersion" || k == "kind" || k == "metadata" {
			continue
		}
		a, err1 := json.Marshal(existing.Object[k])
		b, err2 := json.Marshal(v)
		if err1 != nil || err2 != nil || string(a) != string(b) {
			return false
		}
	}
	return true
}

// appliedLabels are the label keys the bridge's own apply (not its status apply) owns on u, from
// its managed fields; ok is false if the bridge has no apply entry on u.
func appliedLabels(u *unstructured.Unstructured) (map[string]bool, bool) {
	for _, mf := range u.GetManagedFields() {
		if mf.Manager != FieldManager || mf.Operation != metav1.ManagedFieldsOperationApply || mf.Subresource != "" || mf.FieldsV1 == nil {
			continue
		}
		var fields struct {
			Metadata struct {
				Labels map[string]json.RawMessage `json:"f:labels"`
			} `json:"f:metadata"`
		}
		if err := json.Unmarshal(mf.FieldsV1.Raw, &fields); err != nil {
			return nil, false
		}
		out := map[string]bool{}
		for k := range fields.Metadata.Labels {
			if name, ok := strings.CutPrefix(k, "f:"); ok {
				out[name] = true
			}
		}
		return out, true
	}
	return nil, false
}

// ownedByBridge reports whether the bridge wrote u (and so may change or delete it).
func ownedByBridge(u *unstructured.Unstructured) bool {
	return u.GetLabels()[LabelManagedBy] == FieldManager
}

func isNotFound(err error) bool      { return apierrors.IsNotFound(err) }
func isAlreadyExists(err error) bool { return apierrors.IsAlreadyExists(err) }
