package collector

import (
	"context"
	"slices"
	"strings"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
)

// Who owns a service's endpoints (docs/endpoints.md): a namespace a project owns on some
// cluster is merged only from the clusters where that same project owns it, one service per
// owning project; what a cluster reports for it where no project owns it is kept for that
// cluster alone, for platform admins; a namespace no project owns anywhere is merged across
// every cluster, as the seed does. The facts are namespace-binding's view as the authorizer
// mirrors it, so what a service merges and who may read or weight it come from one place.
//
// The filter sits at the merge, not in the endpoint records: the reconciler keeps a service's
// parts (one per cluster) as before and, in an owned namespace, publishes them under the
// service's key as its whole state (Store.owned) plus one served view per owning project
// (key "ns/name@project") made of that project's clusters' parts. Views share the parts' slices,
// so an owned service costs a snapshot and 24 bytes per cluster more, whatever its endpoints.

// Ownership is who owns each namespace on each cluster: *authz.Authorizer.
type Ownership interface {
	// NamespaceBindings returns the bindings of namespace, one per cluster where a project owns it.
	NamespaceBindings(namespace string) []*projectv1.NamespaceBinding
	// NamespaceBindingsChanged is closed at the next change of any binding.
	NamespaceBindingsChanged() <-chan struct{}
	// Ready is closed once the bindings are loaded.
	Ready() <-chan struct{}
}

// UseOwnership makes the collector merge endpoints per owning project. Call it before Run.
// Without it no namespace is owned: every service is merged across all clusters (tests,
// benchmarks).
func (c *Collector) UseOwnership(o Ownership) { c.owners = o }

// owning is the ownership of one namespace: its bindings, nil when no project owns it.
type owning []*projectv1.NamespaceBinding

func (c *Collector) owning(ns string) owning {
	if c.owners == nil {
		return nil
	}
	if o := c.owners.NamespaceBindings(ns); len(o) > 0 {
		return o
	}
	return nil
}

// of returns the project owning the namespace on cluster, "" when none does there.
func (o owning) of(cluster string) string {
	for _, b := range o {
		if b.Cluster == cluster {
			return b.Project
		}
	}
	return ""
}

// signature renders o comparably: which project owns the namespace on which cluster.
func (o owning) signature() string {
	parts := make([]string, 0, len(o))
	for _, b := range o {
		parts = append(parts, b.Cluster+"="+b.Project)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// viewSep separates a service's key from the project whose view a served key is.
const viewSep = "@"

// projectKey is the key of project's view of service key.
func projectKey(key, project string) string { return key + viewSep + project }

func isView(key string) bool { return strings.Contains(key, viewSep) }

// splitKey returns the namespace, name and project ("" for a service merged across every
// cluster) of a served key.
func splitKey(key string) (ns, name, project string) {
	ns, rest, _ := strings.Cut(key, "/")
	name, project, _ = strings.Cut(rest, viewSep)
	return ns, name, project
}

// bucketKey is the key of a served key in bucket `endpoints`: <ns>.<name>, and
// <ns>.<name>.<project> for a project's view.
func bucketKey(key string) string {
	ns, name, project := splitKey(key)
	if project == "" {
		return viewKey(ns, name)
	}
	return keys.Join(ns, name, project)
}

// groupByOwner returns the parts of each project owning the namespace, in the order of parts
// (by cluster name), projects by name. Parts of clusters where no project owns it belong to
// no view.
func groupByOwner(parts []part, o owning) (projects []string, groups [][]part) {
	for _, p := range parts {
		owner := o.of(p.ref().info.name)
		if owner == "" {
			continue
		}
		i, found := slices.BinarySearch(projects, owner)
		if !found {
			projects = slices.Insert(projects, i, owner)
			groups = slices.Insert(groups, i, nil)
		}
		groups[i] = append(groups[i], p)
	}
	return projects, groups
}

// followOwnership re-reconciles the services of every namespace whose ownership changed, so a
// bind or unbind re-evaluates the merge without waiting for a report. ownersSynced is closed
// after the first pass (readiness waits for it: services published before the bindings were
// loaded are published again).
func (c *Collector) followOwnership(ctx context.Context) error {
	if c.owners == nil {
		close(c.ownersSynced)
		return nil
	}
	select {
	case <-c.owners.Ready():
	case <-ctx.Done():
		return nil
	}
	seen := map[string]string{} // namespace → signature, for owned namespaces with services
	first := true
	for {
		changed := c.owners.NamespaceBindingsChanged() // before the pass: a change during it wakes the next
		seen = c.requeueOwnershipChanges(seen)
		if first {
			close(c.ownersSynced)
			first = false
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

// requeueOwnershipChanges queues the services of each namespace whose ownership differs from
// seen, and returns the ownership now.
func (c *Collector) requeueOwnershipChanges(seen map[string]string) map[string]string {
	byNS := map[string][]string{}
	for _, key := range c.store.serviceKeys() {
		ns, _, _ := strings.Cut(key, "/")
		byNS[ns] = append(byNS[ns], key)
	}
	now := map[string]string{}
	for ns, svcs := range byNS {
		sig := c.owning(ns).signature()
		if sig != "" {
			now[ns] = sig
		}
		if sig != seen[ns] {
			for _, key := range svcs {
				c.queue.Add(key)
			}
		}
	}
	return now
}
