package rbacsync

import (
	"maps"
	"slices"
	"sort"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// place is one namespace on one cluster.
type place struct{ cluster, namespace string }

// target is one object rbac-sync may want on a member cluster: the ClusterRole of template on
// cluster (namespace ""), or the RoleBinding of template in namespace of cluster.
type target struct {
	cluster, namespace, template string
}

func (t target) kind() string {
	if t.namespace == "" {
		return kindClusterRole
	}
	return kindRoleBinding
}

// key is the target's key in the desired-rbac bucket.
func (t target) key() string {
	return subjects.DesiredKey(t.cluster, t.kind(), t.namespace, ObjectName(t.template))
}

func (t target) place() place { return place{t.cluster, t.namespace} }

// grantBinding is a namespace binding that gives its place to a project.
type grantBinding struct {
	project string
	place   place
}

type projectRole struct{ project, role string }

// model is the input of the desired computation: templates, project role bindings, namespace
// bindings and clusters, indexed for the lookups each kind of change needs, so an event costs
// the keys it touches and not a scan of everything. The fan-out owns it; the API reads it under
// the fan-out's lock.
type model struct {
	templates map[string]*rbacv1.RoleTemplate
	// children: template -> templates inheriting it directly.
	children  map[string]map[string]bool
	effective map[string][]*rbacv1.PolicyRule // memo, invalidated with descendants

	prbs          map[string]*rbacv1.ProjectRoleBinding // by view key
	byProjectRole map[projectRole]map[string]*rbacv1.ProjectRoleBinding
	rolesOf       map[string]map[string]int // project -> role -> PRB count
	projectsOf    map[string]map[string]int // role -> project -> PRB count

	nsBindings   map[string]grantBinding // by the namespace-binding view key
	placesOf     map[string]map[place]bool
	placesOn     map[string]map[place]bool // cluster -> places
	owner        map[place]string          // place -> project
	ownerBinding map[place]string          // place -> namespace-binding view key

	clusters map[string]bool

	// subjectsJSON memoizes marshalSubjects per (project, role), shared by the RoleBindings
	// of every namespace of the project; setPRB invalidates it.
	subjectsJSON map[projectRole][]byte
}

func newModel() *model {
	return &model{
		templates: map[string]*rbacv1.RoleTemplate{}, children: map[string]map[string]bool{}, effective: map[string][]*rbacv1.PolicyRule{},
		prbs: map[string]*rbacv1.ProjectRoleBinding{}, byProjectRole: map[projectRole]map[string]*rbacv1.ProjectRoleBinding{},
		rolesOf: map[string]map[string]int{}, projectsOf: map[string]map[string]int{},
		nsBindings: map[string]grantBinding{}, placesOf: map[string]map[place]bool{}, placesOn: map[string]map[place]bool{},
		owner: map[place]string{}, ownerBinding: map[place]string{},
		clusters: map[string]bool{}, subjectsJSON: map[projectRole][]byte{},
	}
}

func (m *model) template(name string) (*rbacv1.RoleTemplate, bool) {
	t, ok := m.templates[name]
	return t, ok
}

// rules returns the effective rules of template name (see effectiveRules).
func (m *model) rules(name string) []*rbacv1.PolicyRule {
	if r, ok := m.effective[name]; ok {
		return r
	}
	r := effectiveRules(m.template, name)
	m.effective[name] = r
	return r
}

// descendants returns name and every template inheriting it, transitively.
func (m *model) descendants(name string) []string {
	out := []string{name}
	seen := map[string]bool{name: true}
	for i := 0; i < len(out); i++ {
		for c := range m.children[out[i]] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out
}

// setTemplate records template name as t (nil: deleted) and returns the targets it affects.
func (m *model) setTemplate(name string, t *rbacv1.RoleTemplate) []target {
	old, existed := m.templates[name]
	if existed {
		for _, p := range old.Inherits {
			delete(m.children[p], name)
		}
	}
	if t != nil {
		m.templates[name] = t
		for _, p := range t.Inherits {
			if m.children[p] == nil {
				m.children[p] = map[string]bool{}
			}
			m.children[p][name] = true
		}
	} else {
		delete(m.templates, name)
	}
	affected := m.descendants(name)
	var out []target
	for _, a := range affected {
		delete(m.effective, a)
		for c := range m.clusters {
			out = append(out, target{cluster: c, template: a})
		}
	}
	// RoleBindings refer to the ClusterRole by name: they change only when the template
	// appears or disappears, not when its rules do.
	if existed != (t != nil) {
		for p := range m.projectsOf[name] {
			for pl := range m.placesOf[p] {
				out = append(out, target{cluster: pl.cluster, namespace: pl.namespace, template: name})
			}
		}
	}
	return out
}

// setPRB records the project role binding at view key k (nil: unbound) and returns the
// targets it affects.
func (m *model) setPRB(k string, b *rbacv1.ProjectRoleBinding) []target {
	var out []target
	if old, ok := m.prbs[k]; ok {
		pr := projectRole{old.Project, old.RoleTemplate}
		delete(m.subjectsJSON, pr)
		delete(m.byProjectRole[pr], k)
		if len(m.byProjectRole[pr]) == 0 {
			delete(m.byProjectRole, pr)
		}
		decr(m.rolesOf, old.Project, old.RoleTemplate)
		decr(m.projectsOf, old.RoleTemplate, old.Project)
		delete(m.prbs, k)
		out = append(out, m.roleTargets(old.Project, old.RoleTemplate)...)
	}
	if b != nil {
		m.prbs[k] = b
		pr := projectRole{b.Project, b.RoleTemplate}
		delete(m.subjectsJSON, pr)
		if m.byProjectRole[pr] == nil {
			m.byProjectRole[pr] = map[string]*rbacv1.ProjectRoleBinding{}
		}
		m.byProjectRole[pr][k] = b
		incr(m.rolesOf, b.Project, b.RoleTemplate)
		incr(m.projectsOf, b.RoleTemplate, b.Project)
		out = append(out, m.roleTargets(b.Project, b.RoleTemplate)...)
	}
	return out
}

// roleTargets are the RoleBindings of role in every place of project.
func (m *model) roleTargets(project, role string) []target {
	out := make([]target, 0, len(m.placesOf[project]))
	for pl := range m.placesOf[project] {
		out = append(out, target{cluster: pl.cluster, namespace: pl.namespace, template: role})
	}
	return out
}

// setNamespaceBinding records the namespace binding at view key k as granting its place to a
// project (nil: not granting: gone, terminating or owned by another) and returns the targets
// it affects. written lists the RoleBindings currently in desired state at a place, so that
// whatever the place held is recomputed when it changes hands.
func (m *model) setNamespaceBinding(k string, g *grantBinding, written func(place) []target) []target {
	var out []target
	if old, ok := m.nsBindings[k]; ok {
		delete(m.nsBindings, k)
		delete(m.placesOf[old.project], old.place)
		if len(m.placesOf[old.project]) == 0 {
			delete(m.placesOf, old.project)
		}
		delete(m.placesOn[old.place.cluster], old.place)
		if m.ownerBinding[old.place] == k {
			delete(m.owner, old.place)
			delete(m.ownerBinding, old.place)
		}
		out = append(out, m.placeTargets(old.project, old.place)...)
		out = append(out, written(old.place)...)
	}
	if g != nil {
		m.nsBindings[k] = *g
		if m.placesOf[g.project] == nil {
			m.placesOf[g.project] = map[place]bool{}
		}
		m.placesOf[g.project][g.place] = true
		if m.placesOn[g.place.cluster] == nil {
			m.placesOn[g.place.cluster] = map[place]bool{}
		}
		m.placesOn[g.place.cluster][g.place] = true
		m.owner[g.place] = g.project
		m.ownerBinding[g.place] = k
		out = append(out, m.placeTargets(g.project, g.place)...)
		out = append(out, written(g.place)...)
	}
	return out
}

// placeTargets are the RoleBindings of every role of project at pl.
func (m *model) placeTargets(project string, pl place) []target {
	out := make([]target, 0, len(m.rolesOf[project]))
	for role := range m.rolesOf[project] {
		out = append(out, target{cluster: pl.cluster, namespace: pl.namespace, template: role})
	}
	return out
}

// setCluster records whether cluster is registered and returns the targets it affects.
// written lists what the desired state holds for the cluster.
func (m *model) setCluster(cluster string, registered bool, written func(cluster string) []target) []target {
	if m.clusters[cluster] == registered {
		return nil
	}
	if registered {
		m.clusters[cluster] = true
	} else {
		delete(m.clusters, cluster)
	}
	out := written(cluster)
	for name := range m.templates {
		out = append(out, target{cluster: cluster, template: name})
	}
	for pl := range m.placesOn[cluster] {
		out = append(out, m.placeTargets(m.owner[pl], pl)...)
	}
	return out
}

// all returns every target the model wants, for a full reconcile.
func (m *model) all() []target {
	var out []target
	for c := range m.clusters {
		for name := range m.templates {
			out = append(out, target{cluster: c, template: name})
		}
	}
	for pl, p := range m.owner {
		out = append(out, m.placeTargets(p, pl)...)
	}
	return out
}

// subjects returns the subjects of project's bindings to role, sorted.
func (m *model) subjects(project, role string) []*rbacv1.Subject {
	var out []*rbacv1.Subject
	for _, b := range m.byProjectRole[projectRole{project, role}] {
		out = append(out, b.Subject)
	}
	return sortSubjects(out)
}

// desired computes what t should be: an object, or nil when nothing is wanted. This is the
// whole of rbac-sync's logic: a function of (templates, PRBs, namespace bindings, clusters).
// It fills memos, so the caller holds the fan-out's write lock.
func (m *model) desired(t target) *desiredv1.DesiredObject {
	if !m.clusters[t.cluster] {
		return nil
	}
	if _, ok := m.templates[t.template]; !ok {
		return nil
	}
	if t.namespace == "" {
		return clusterRoleObject(t.template, m.rules(t.template))
	}
	project, ok := m.owner[t.place()]
	if !ok {
		return nil
	}
	pr := projectRole{project, t.template}
	if len(m.byProjectRole[pr]) == 0 {
		return nil
	}
	subs, ok := m.subjectsJSON[pr]
	if !ok {
		subs = marshalSubjects(m.subjects(project, t.template))
		m.subjectsJSON[pr] = subs
	}
	return roleBindingObject(project, t.namespace, t.template, subs)
}

// grantsAt lists who holds what at pl, for WhoCan.
func (m *model) grantsAt(pl place) (string, []*rbacv1.Grant) {
	project, ok := m.owner[pl]
	if !ok {
		return "", nil
	}
	var out []*rbacv1.Grant
	roles := slices.Sorted(maps.Keys(m.rolesOf[project]))
	for _, role := range roles {
		_, exists := m.templates[role]
		var rules []*rbacv1.PolicyRule
		if exists {
			rules = m.rules(role)
		}
		bs := slices.Collect(maps.Values(m.byProjectRole[projectRole{project, role}]))
		sort.Slice(bs, func(i, j int) bool { return subjectID(bs[i].Subject) < subjectID(bs[j].Subject) })
		for _, b := range bs {
			out = append(out, &rbacv1.Grant{
				Subject: b.Subject, Project: project, Cluster: pl.cluster, Namespace: pl.namespace,
				RoleTemplate: role, ClusterRole: ObjectName(role), RoleBinding: ObjectName(role),
				Rules: rules, BoundTime: b.CreateTime, TemplateMissing: !exists,
			})
		}
	}
	return project, out
}

func incr(m map[string]map[string]int, a, b string) {
	if m[a] == nil {
		m[a] = map[string]int{}
	}
	m[a][b]++
}

func decr(m map[string]map[string]int, a, b string) {
	if m[a] == nil {
		return
	}
	m[a][b]--
	if m[a][b] <= 0 {
		delete(m[a], b)
	}
	if len(m[a]) == 0 {
		delete(m, a)
	}
}
