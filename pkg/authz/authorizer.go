// Package authz decides what an authenticated caller may do through Fleetstream's APIs. One
// table (table.go) maps every procedure to a verb, a resource and a scope; one Connect
// interceptor (interceptor.go) enforces it before any handler runs; handlers whose answers
// depend on the caller (filtered lists and watches, the escalation check of role bindings) ask
// the Caller the interceptor puts in the context.
//
// Rights come from two places only: platform admins (users and groups named by flags), and the
// rules of the role templates bound to the caller in a project (rbac-sync's views), read as
// Kubernetes RBAC reads rules, with Fleetstream's resources in API group fleetstream.io. No
// name prefix makes anyone an admin, and a service inside the process never borrows a user's
// name: handlers are reached only through the interceptor.
package authz

import (
	"context"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Config names the platform admins.
type Config struct {
	// PlatformAdmins are users (as the authenticator names them) allowed everything.
	PlatformAdmins []string
	// PlatformAdminGroups are groups whose members are allowed everything.
	PlatformAdminGroups []string
	// XDSReaders and XDSReaderGroups hold the xds-reader role: they may read the fleet-wide
	// xDS feed of endpoints (proxies), and nothing else.
	XDSReaders      []string
	XDSReaderGroups []string
}

// Anonymous is the caller of a server running with --insecure-dev (no authentication).
const Anonymous = "anonymous"

// Authorizer answers authorization questions from in-memory mirrors of the views they depend
// on: role templates and project role bindings (rbac-sync), namespace bindings
// (namespace-binding). A revocation takes effect as soon as the mirror sees it, i.e. within the
// view's latency; nothing is cached beyond the mirrors.
type Authorizer struct {
	cfg Config
	js  jetstream.JetStream
	log *zap.Logger

	ready      chan struct{}
	templates  *mirror[*rbacv1.RoleTemplate]
	bindings   *mirror[*rbacv1.ProjectRoleBinding]
	namespaces *mirror[*projectv1.NamespaceBinding]
	// Set roles, and what decides a cluster's sets: the sets and the registry.
	setRoles *mirror[*placementv1.ClusterSetRoleBinding]
	sets     *mirror[*placementv1.ClusterSet]
	clusters *mirror[*clusterv1.Cluster]

	// A subject's effective rules per project and per cluster set, and the projects owning a
	// namespace.
	heldMemo   memo[string, map[string][]*rbacv1.PolicyRule]
	setMemo    memo[string, map[string][]*rbacv1.PolicyRule]
	ownersMemo memo[place, []string]

	// denials, if set, records every denied call (RecordDenials).
	denials DenialRecorder
}

// New returns an authorizer reading the views through js; Run starts it.
func New(js jetstream.JetStream, cfg Config, log *zap.Logger) *Authorizer {
	a := &Authorizer{cfg: cfg, js: js, log: log.Named("authz"), ready: make(chan struct{}),
		templates: newMirror(subjects.RBACTemplatesBucket, func() *rbacv1.RoleTemplate { return &rbacv1.RoleTemplate{} }),
		bindings: newMirror(subjects.RBACBindingsBucket, func() *rbacv1.ProjectRoleBinding { return &rbacv1.ProjectRoleBinding{} },
			view.WithIndex(func(_ string, b *rbacv1.ProjectRoleBinding) []string {
				switch b.GetSubject().GetKind() {
				case rbacv1.SubjectKind_SUBJECT_KIND_USER:
					return []string{userTerm(b.Subject.Name)}
				case rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
					return []string{groupTerm(b.Subject.Name)}
				}
				return nil // service accounts are Kubernetes identities, not API callers
			})),
		namespaces: newMirror(subjects.NamespaceBindingsBucket, func() *projectv1.NamespaceBinding { return &projectv1.NamespaceBinding{} },
			view.WithIndex(func(_ string, b *projectv1.NamespaceBinding) []string { return []string{nsTerm(b.Namespace)} })),
		setRoles: newMirror(subjects.ClusterSetRolesBucket, func() *placementv1.ClusterSetRoleBinding { return &placementv1.ClusterSetRoleBinding{} },
			view.WithIndex(setRoleIndex)),
		sets:     newMirror(subjects.ClusterSetsBucket, func() *placementv1.ClusterSet { return &placementv1.ClusterSet{} }),
		clusters: newMirror(subjects.ClustersBucket, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }),
	}
	a.heldMemo.deps = func() []<-chan struct{} { return append(a.templates.changed(), a.bindings.changed()...) }
	a.setMemo.deps = a.setRoles.changed
	a.ownersMemo.deps = a.namespaces.changed
	return a
}

// Ready is closed once every mirror has loaded its bucket.
func (a *Authorizer) Ready() <-chan struct{} { return a.ready }

// Index terms of the bindings mirror: the subject a binding grants to.
func userTerm(u string) string  { return "u:" + u }
func groupTerm(g string) string { return "g:" + g }

// nsTerm is the index term of the namespace-bindings mirror: the namespace, on any cluster.
func nsTerm(ns string) string { return "ns:" + ns }

// Run mirrors the views until ctx ends. Ready closes once each view is loaded, or known not to
// exist yet (then it is attached when its owner creates it).
func (a *Authorizer) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, m := range a.mirrors() {
		g.Go(func() error { return m.run(ctx, a.js, a.log) })
	}
	g.Go(func() error {
		for _, m := range a.mirrors() {
			ch := m.readyCh()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil
			}
		}
		close(a.ready)
		return nil
	})
	err := g.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// catchUpWait bounds how long a denial waits for the mirrors to reach their buckets.
const catchUpWait = 2 * time.Second

// catchUp brings every mirror up to its bucket as it is now (bounded): before a denial is
// final, so that a grant (or a namespace binding) the API has already confirmed is honoured by
// every process at once, wherever its views are read.
func (a *Authorizer) catchUp(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	g, ctx := errgroup.WithContext(ctx)
	for _, m := range a.mirrors() {
		g.Go(func() error { return m.catchUp(ctx, a.js) })
	}
	if err := g.Wait(); err != nil {
		a.log.Debug("authorization views did not catch up", zap.Error(err))
	}
}

// follower is what Run and catchUp do with each mirror, whatever it holds.
type follower interface {
	run(ctx context.Context, js jetstream.JetStream, log *zap.Logger) error
	catchUp(ctx context.Context, js jetstream.JetStream) error
	readyCh() <-chan struct{}
}

func (a *Authorizer) mirrors() []follower {
	return []follower{a.templates, a.bindings, a.namespaces, a.setRoles, a.sets, a.clusters}
}

// isAdmin reports whether the subject is a platform admin.
func (a *Authorizer) isAdmin(user string, groups []string) bool {
	if slices.Contains(a.cfg.PlatformAdmins, user) {
		return true
	}
	for _, g := range groups {
		if slices.Contains(a.cfg.PlatformAdminGroups, g) {
			return true
		}
	}
	return false
}

// isXDSReader reports whether the subject holds the xds-reader role.
func (a *Authorizer) isXDSReader(user string, groups []string) bool {
	if slices.Contains(a.cfg.XDSReaders, user) {
		return true
	}
	for _, g := range groups {
		if slices.Contains(a.cfg.XDSReaderGroups, g) {
			return true
		}
	}
	return false
}

func (a *Authorizer) template(name string) (*rbacv1.RoleTemplate, bool) {
	return a.templates.getKey(keys.Encode(name))
}

// rulesByProject returns, per project, the effective rules bound to the user or its groups.
func (a *Authorizer) rulesByProject(user string, groups []string) map[string][]*rbacv1.PolicyRule {
	key := user
	for _, g := range groups {
		key += "\x00" + g
	}
	return a.heldMemo.get(key, func() map[string][]*rbacv1.PolicyRule { return a.computeRules(user, groups) })
}

func (a *Authorizer) computeRules(user string, groups []string) map[string][]*rbacv1.PolicyRule {
	out := map[string][]*rbacv1.PolicyRule{}
	add := func(bs []*rbacv1.ProjectRoleBinding) {
		for _, b := range bs {
			out[b.Project] = append(out[b.Project], roles.EffectiveRules(a.template, b.RoleTemplate)...)
		}
	}
	if user != "" {
		add(a.bindings.lookup(userTerm(user)))
	}
	for _, g := range groups {
		add(a.bindings.lookup(groupTerm(g)))
	}
	return out
}

// place is a namespace on a cluster ("" for any cluster).
type place struct{ cluster, namespace string }

// owners returns the projects owning namespace on cluster, or on any cluster when cluster is "".
func (a *Authorizer) owners(cluster, namespace string) []string {
	return a.ownersMemo.get(place{cluster, namespace}, func() []string { return a.computeOwners(cluster, namespace) })
}

func (a *Authorizer) computeOwners(cluster, namespace string) []string {
	if cluster != "" {
		if b, ok := a.namespaces.getKey(keys.Join(cluster, namespace)); ok {
			return []string{b.Project}
		}
		return nil
	}
	var out []string
	for _, b := range a.namespaces.lookup(nsTerm(namespace)) {
		if !slices.Contains(out, b.Project) {
			out = append(out, b.Project)
		}
	}
	return out
}
