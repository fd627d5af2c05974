package authz

import (
	"fmt"
	"strconv"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/roles"
)

// ScopeKind says where a right must hold.
type ScopeKind int

const (
	// Platform: only platform admins.
	Platform ScopeKind = iota + 1
	// Authenticated: anyone signed in.
	Authenticated
	// Project: the project the request names.
	Project
	// Namespace: the project owning the namespace the request names (on its cluster, or on
	// every cluster where one owns it); platform admins only where no project owns it.
	Namespace
	// Filtered: anyone signed in, and the handler answers only with what the caller may see.
	Filtered
	// XDSReaders: platform admins and the xds-reader role (users and groups named by
	// --xds-readers and --xds-reader-groups): the fleet-wide feed proxies read.
	XDSReaders
	// NamespaceView: a project owning the namespace on some cluster, any one of them; the
	// handler answers with the view of the projects the caller holds the right in (a service's
	// endpoints, merged per owning project). Platform admins only where no project owns it.
	NamespaceView
	// ClusterSet: the cluster set the request names, through a set role (or as a platform
	// admin); with Also, the request needs that right in Project as well.
	ClusterSet
	// ClusterMember: the cluster the request names, through a set role on the sets it is in
	// before and after the request (Caller.decideClusterUpdate).
	ClusterMember
)

// Scope is where one request needs its right.
type Scope struct {
	Kind               ScopeKind
	Project            string
	Cluster, Namespace string
	ClusterSet         string
	// Also is a right needed in Project besides the rule's own (ClusterSet scopes).
	Also *Right
	// update is the request a ClusterMember scope decides on; detail says why it was refused.
	update *clusterv1.UpdateClusterRequest
	detail string
}

// Right is verb on resource of API group Group.
type Right struct{ Verb, Group, Resource string }

// String renders the scope for a denial message.
func (s Scope) String() string {
	switch s.Kind {
	case Project:
		return "in project " + strconv.Quote(s.Project)
	case Namespace:
		if s.Cluster == "" {
			return fmt.Sprintf("in namespace %q (every project owning it on any cluster)", s.Namespace)
		}
		return fmt.Sprintf("in namespace %q on cluster %q", s.Namespace, s.Cluster)
	case NamespaceView:
		return fmt.Sprintf("in namespace %q (no project owning it on any cluster grants it; a namespace no project owns is the platform's)", s.Namespace)
	case ClusterSet:
		out := "in cluster set " + strconv.Quote(s.ClusterSet)
		if s.Also != nil {
			out += fmt.Sprintf(" (and %s %s in project %q)", s.Also.Verb, resourceName(s.Also.Group, s.Also.Resource), s.Project)
		}
		return out
	case ClusterMember:
		return fmt.Sprintf("on cluster %q%s", s.Cluster, s.detail)
	case Platform:
		return "fleet-wide (platform admins only)"
	case XDSReaders:
		return "fleet-wide (xds-readers and platform admins only)"
	default:
		return "for any signed-in user"
	}
}

// Rule is the right a procedure needs: verb on resource (of API group Group) within the scope
// its request names.
type Rule struct {
	Verb, Group, Resource string
	scope                 func(msg any) Scope
}

// ScopeOf returns where the rule must hold for request msg. A message of an unexpected type
// (impossible through the generated handlers) is treated as platform-only.
func (r Rule) ScopeOf(msg any) Scope { return r.scope(msg) }

// Lookup returns the rule of a procedure (e.g. "/fleetstream.project.v1.ProjectService/BindNamespace").
func Lookup(procedure string) (Rule, bool) {
	r, ok := table[procedure]
	return r, ok
}

// resourceName renders resource.group the way Kubernetes names resources in messages.
func (r Rule) resourceName() string { return resourceName(r.Group, r.Resource) }

func resourceName(group, resource string) string {
	if group == "" {
		return resource
	}
	return resource + "." + group
}

func fixed(k ScopeKind) func(any) Scope { return func(any) Scope { return Scope{Kind: k} } }

func admin(verb, resource string) Rule {
	return Rule{Verb: verb, Group: roles.Group, Resource: resource, scope: fixed(Platform)}
}

func xdsReader(verb string) Rule {
	return Rule{Verb: verb, Group: roles.Group, Resource: roles.ResXDS, scope: fixed(XDSReaders)}
}

func anyone(verb, resource string) Rule {
	return Rule{Verb: verb, Group: roles.Group, Resource: resource, scope: fixed(Authenticated)}
}

func filtered(verb, resource string) Rule {
	return Rule{Verb: verb, Group: roles.Group, Resource: resource, scope: fixed(Filtered)}
}

func custom[T any](verb, resource string, f func(T) Scope) Rule {
	return Rule{Verb: verb, Group: roles.Group, Resource: resource, scope: func(m any) Scope {
		t, ok := m.(T)
		if !ok {
			return Scope{Kind: Platform}
		}
		return f(t)
	}}
}

func inProject[T any](verb, resource string, project func(T) string) Rule {
	return inProjectGroup(verb, roles.Group, resource, project)
}

func inProjectGroup[T any](verb, group, resource string, project func(T) string) Rule {
	r := custom(verb, resource, func(m T) Scope { return Scope{Kind: Project, Project: project(m)} })
	r.Group = group
	return r
}

// inNamespaceView is inNamespace for procedures answering with the caller's project's view of
// a namespace owned per cluster: a request naming no cluster needs the right in one project
// owning the namespace (NamespaceView), one naming a cluster the right in the project owning it
// there.
func inNamespaceView[T any](verb, resource string, where func(T) (cluster, namespace string)) Rule {
	return custom(verb, resource, func(m T) Scope {
		c, ns := where(m)
		if c == "" {
			return Scope{Kind: NamespaceView, Namespace: ns}
		}
		return Scope{Kind: Namespace, Cluster: c, Namespace: ns}
	})
}

// inClusterSet needs the right in the cluster set the request names, through a set role.
func inClusterSet[T any](verb, resource string, set func(T) string) Rule {
	return custom(verb, resource, func(m T) Scope { return Scope{Kind: ClusterSet, ClusterSet: set(m)} })
}

// inClusterSetAndProject needs the right in the cluster set the request names and also the
// right also in its project: binding a set to a project concerns both.
func inClusterSetAndProject[T any](verb, resource string, also Right, where func(T) (set, project string)) Rule {
	return custom(verb, resource, func(m T) Scope {
		set, project := where(m)
		return Scope{Kind: ClusterSet, ClusterSet: set, Project: project, Also: &also}
	})
}

// clusterMember needs the right through the set roles on the sets the updated cluster is in.
func clusterMember(verb, resource string) Rule {
	return custom(verb, resource, func(m *clusterv1.UpdateClusterRequest) Scope {
		return Scope{Kind: ClusterMember, Cluster: m.Name, update: m}
	})
}

func inNamespace[T any](verb, resource string, where func(T) (cluster, namespace string)) Rule {
	return custom(verb, resource, func(m T) Scope {
		c, ns := where(m)
		return Scope{Kind: Namespace, Cluster: c, Namespace: ns}
	})
}
