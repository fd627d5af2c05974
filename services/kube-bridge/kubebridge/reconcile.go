package kubebridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	inventoryv1alpha1 "github.com/fleetstream/fleetstream/services/kube-bridge/inventory/v1alpha1"
)

// profileKeys are every cluster of the registry and every ClusterProfile of the namespace (one
// whose cluster went while the bridge was away is looked at, and deleted if it is the bridge's).
func (b *Bridge) profileKeys() []string {
	var out []string
	for _, c := range b.clusters.List(nil) {
		out = append(out, c.GetName())
	}
	for _, obj := range b.profileInformer.GetStore().List() {
		out = append(out, objectName(obj))
	}
	return out
}

// reconcileProfile brings the ClusterProfile of cluster name in line with the registry: applied
// while the cluster is registered, deleted once it is not. A profile of that name that another
// cluster manager publishes is left alone (and logged): the bridge never takes one over.
func (b *Bridge) reconcileProfile(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}
	existing := stored(b.profileInformer, b.cfg.Namespace, name)
	c, ok := b.clusters.Get(keys.Encode(name))
	if !ok || c.GetName() != name {
		if existing == nil || !ownedByBridge(existing) {
			return nil // no such cluster; another manager's profile is none of the bridge's business
		}
		return b.remove(ctx, inventoryv1alpha1.GroupVersionResource, b.cfg.Namespace, name, existing.GetUID())
	}
	if existing != nil && !ownedByBridge(existing) {
		manager, _, _ := unstructured.NestedString(existing.Object, "spec", "clusterManager", "name")
		b.foreign.WithLabelValues("ClusterProfile").Inc()
		b.log.Warn("ClusterProfile of another cluster manager: not published", zap.String("cluster", name),
			zap.String("namespace", b.cfg.Namespace), zap.String("clusterManager", manager))
		return nil
	}
	var old inventoryv1alpha1.ClusterProfile
	generation := int64(0)
	if existing != nil {
		// A profile that does not decode keeps no transition times: they are set afresh.
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(existing.Object, &old)
		generation = existing.GetGeneration()
	}
	p, dropped := clusterProfile(c, b.cfg.Namespace, old.Status.Conditions, generation, b.now())
	if existing != nil {
		if want, err := toMap(p); err == nil && upToDate(existing, want) {
			return nil
		}
	}
	if len(dropped) > 0 {
		b.leftOut.WithLabelValues("ClusterProfile").Inc()
		b.log.Warn("ClusterProfile: left out what the hub would refuse", zap.String("cluster", name), zap.Strings("fields", dropped))
	}
	got, err := b.apply(ctx, inventoryv1alpha1.GroupVersionResource, p, false)
	if err != nil {
		return err
	}
	if got.GetGeneration() != generation {
		// The conditions observe the generation the spec apply produced.
		p.Status.Conditions = profileConditions(c, condition(c, conditionAgentConnected), old.Status.Conditions, got.GetGeneration(), b.now())
	}
	_, err = b.apply(ctx, inventoryv1alpha1.GroupVersionResource, p, true)
	return err
}

// placementKeys are every decision of the scheduler's view and every PlacementDecision the
// bridge wrote.
func (b *Bridge) placementKeys() []string {
	var out []string
	for _, e := range b.decisions.Entries(nil) {
		out = append(out, e.Key)
	}
	out = append(out, b.decisionInformer.GetIndexer().ListIndexFuncValues(byPlacement)...)
	return out
}

// queueProject queues every decision of project (its namespace mapping changed).
func (b *Bridge) queueProject(project string) {
	prefix := keys.Encode(project) + "."
	for _, e := range b.decisions.Entries(func(key string, _ *placementv1.PlacementDecisions) bool { return strings.HasPrefix(key, prefix) }) {
		b.placements.Add(e.Key)
	}
	for _, k := range b.decisionInformer.GetIndexer().ListIndexFuncValues(byPlacement) {
		if strings.HasPrefix(k, prefix) {
			b.placements.Add(k)
		}
	}
}

// projectNamespace is the hub namespace mapped to project: the one namespace labelled
// fleetstream.io/project=<project>. None, or more than one (which a platform admin must
// resolve), publishes nothing.
func (b *Bridge) projectNamespace(project string) (string, error) {
	objs, err := b.namespaceInformer.GetIndexer().ByIndex(byProject, project)
	if err != nil {
		return "", err
	}
	var names []string
	for _, o := range objs {
		if m, ok := o.(metav1.Object); ok && m.GetDeletionTimestamp() == nil {
			names = append(names, m.GetName())
		}
	}
	switch len(names) {
	case 0:
		return "", nil
	case 1:
		return names[0], nil
	}
	slices.Sort(names)
	return "", fmt.Errorf("project %s is mapped to %d hub namespaces (%s): label one only", project, len(names), strings.Join(names, ", "))
}

// reconcilePlacement brings the PlacementDecisions of one placement (key: the decisions view's,
// keys.Join(project, name)) in line with its decision: one per page in the project's hub
// namespace; the bridge's others of that placement (pages gone, a namespace no longer mapped,
// the placement deleted) are deleted.
func (b *Bridge) reconcilePlacement(ctx context.Context, key string) error {
	parts, err := keys.Split(key)
	if err != nil || len(parts) != 2 {
		return nil // not a placement's key: nothing of it exists
	}
	project := parts[0]
	namespace, mapErr := b.projectNamespace(project)
	if mapErr != nil {
		b.log.Warn("PlacementDecisions not published", zap.String("project", project), zap.Error(mapErr))
	}
	want := map[string]bool{}
	var errs []error
	if d, ok := b.decisions.Get(key); ok && namespace != "" {
		pds, dropped := placementDecisions(d, namespace)
		applied := false
		defer func() {
			// Said when objects are written without them, not on every resync.
			if applied && len(dropped) > 0 {
				b.leftOut.WithLabelValues("PlacementDecision").Inc()
				b.log.Warn("PlacementDecision: left out what the hub would refuse", zap.String("placement", key), zap.Strings("fields", dropped))
			}
		}()
		for _, pd := range pds {
			want[pd.Namespace+"/"+pd.Name] = true
			existing := stored(b.decisionInformer, pd.Namespace, pd.Name)
			if existing != nil {
				if m, err := toMap(pd); err == nil && upToDate(existing, m) {
					continue
				}
			}
			if existing == nil {
				// Not one of the bridge's (its informer sees only those): never take over an
				// object of that name someone else made (OCM's own scheduler, say).
				other, err := b.dyn.Resource(PlacementDecisionGVR).Namespace(pd.Namespace).Get(ctx, pd.Name, metav1.GetOptions{})
				if err == nil && !ownedByBridge(other) {
					b.foreign.WithLabelValues("PlacementDecision").Inc()
					b.log.Warn("PlacementDecision of another writer: not published", zap.String("namespace", pd.Namespace), zap.String("name", pd.Name))
					continue
				}
				if err != nil && !isNotFound(err) {
					errs = append(errs, err)
					continue
				}
			}
			applied = true
			if _, err := b.apply(ctx, PlacementDecisionGVR, pd, true); err != nil {
				errs = append(errs, err)
			}
		}
	}
	objs, err := b.decisionInformer.GetIndexer().ByIndex(byPlacement, key)
	if err != nil {
		return err
	}
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok || want[u.GetNamespace()+"/"+u.GetName()] || !ownedByBridge(u) {
			continue
		}
		if err := b.remove(ctx, PlacementDecisionGVR, u.GetNamespace(), u.GetName(), u.GetUID()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
