package placement

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/authz"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// ClusterSetAPI: role bindings on cluster sets (docs/placement.md, "Cluster set roles").

// subjectKindToken names a subject kind as Kubernetes does, in keys and messages.
func subjectKindToken(k rbacv1.SubjectKind) string {
	switch k {
	case rbacv1.SubjectKind_SUBJECT_KIND_USER:
		return "User"
	case rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		return "Group"
	}
	return "Unspecified"
}

func setRoleKey(set string, s *rbacv1.Subject, role string) string {
	return subjects.ClusterSetRoleKey(set, subjectKindToken(s.GetKind()), s.GetName(), role)
}

func setRoleSubject(set string, s *rbacv1.Subject, role string) string {
	return subjects.ClusterSetRole(set, subjectKindToken(s.GetKind()), s.GetName(), role)
}

func describeSetRole(set string, s *rbacv1.Subject, role string) string {
	return fmt.Sprintf("%s/%s:%s:%s", set, subjectKindToken(s.GetKind()), s.GetName(), role)
}

func (s *ClusterSetAPI) BindClusterSetRole(ctx context.Context, req *connect.Request[placementv1.BindClusterSetRoleRequest]) (*connect.Response[placementv1.BindClusterSetRoleResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateSetRoleRef(&v, m.ClusterSet, m.Subject, m.Role)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	// Unlike a set binding, a role names an existing set: a typo would otherwise grant on a set
	// someone creates later.
	if _, ok := s.clusterSets.Get(clusterSetKey(m.ClusterSet)); !ok {
		return nil, apierr.NotFound("cluster set", m.ClusterSet)
	}
	key, what := setRoleKey(m.ClusterSet, m.Subject, m.Role), describeSetRole(m.ClusterSet, m.Subject, m.Role)
	if _, ok := s.setRoles.Get(key); ok {
		return nil, apierr.AlreadyExists("cluster set role binding", what)
	}
	b := &placementv1.ClusterSetRoleBinding{ClusterSet: m.ClusterSet, Subject: m.Subject, Role: m.Role}
	seq, err := viewapi.Create(ctx, s.store, s.stream, setRoleSubject(m.ClusterSet, m.Subject, m.Role), key,
		func(last proto.Message) bool { _, gone := last.(*placementv1.ClusterSetRoleUnbound); return gone },
		&placementv1.ClusterSetRoleBound{Binding: b}, apierr.AlreadyExists("cluster set role binding", what))
	if err != nil {
		return nil, err
	}
	out, ok, err := viewapi.Await(ctx, s.setRoles, key, seq)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, apierr.Concurrent("cluster set role binding %s", what)
	}
	s.log.Info("cluster set role bound", zap.String("cluster_set", m.ClusterSet), zap.String("subject", subjectKindToken(m.Subject.Kind)+":"+m.Subject.Name),
		zap.String("role", m.Role), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.BindClusterSetRoleResponse{Binding: out}), nil
}

func (s *ClusterSetAPI) UnbindClusterSetRole(ctx context.Context, req *connect.Request[placementv1.UnbindClusterSetRoleRequest]) (*connect.Response[placementv1.UnbindClusterSetRoleResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateSetRoleRef(&v, m.ClusterSet, m.Subject, m.Role)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	key, what := setRoleKey(m.ClusterSet, m.Subject, m.Role), describeSetRole(m.ClusterSet, m.Subject, m.Role)
	cur, err := viewapi.Remove(ctx, s.store, setRoleSubject(m.ClusterSet, m.Subject, m.Role), key,
		func() (*placementv1.ClusterSetRoleBinding, error) {
			if cur, ok := s.setRoles.Get(key); ok {
				return cur, nil
			}
			return nil, apierr.NotFound("cluster set role binding", what)
		},
		func(*placementv1.ClusterSetRoleBinding) proto.Message {
			return &placementv1.ClusterSetRoleUnbound{ClusterSet: m.ClusterSet, Subject: m.Subject, Role: m.Role}
		},
		apierr.Concurrent("cluster set role binding %s", what))
	if err != nil {
		return nil, err
	}
	if err := viewapi.AwaitPast(ctx, s.setRoles, key, cur.Revision); err != nil {
		return nil, err
	}
	s.log.Info("cluster set role unbound", zap.String("cluster_set", m.ClusterSet), zap.String("subject", subjectKindToken(m.Subject.Kind)+":"+m.Subject.Name),
		zap.String("role", m.Role), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&placementv1.UnbindClusterSetRoleResponse{}), nil
}

func (s *ClusterSetAPI) ListClusterSetRoleBindings(ctx context.Context, req *connect.Request[placementv1.ListClusterSetRoleBindingsRequest]) (*connect.Response[placementv1.ListClusterSetRoleBindingsResponse], error) {
	m := req.Msg
	var v apierr.Violations
	if m.ClusterSet != "" {
		v.DNSLabel("cluster_set", m.ClusterSet)
	}
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	caller := authz.CallerFrom(ctx)
	if m.ClusterSet != "" && !caller.CanInClusterSet("list", roles.Group, roles.ResClusterSetRoles, m.ClusterSet) {
		return nil, authz.Denied(caller, "list", roles.ResClusterSetRoles+"."+roles.Group, authz.Scope{Kind: authz.ClusterSet, ClusterSet: m.ClusterSet})
	}
	var list []*placementv1.ClusterSetRoleBinding
	if m.ClusterSet != "" {
		list = s.setRoles.Lookup(bySet(m.ClusterSet))
	} else {
		list = s.setRoles.List(func(_ string, b *placementv1.ClusterSetRoleBinding) bool {
			return caller.CanInClusterSet("list", roles.Group, roles.ResClusterSetRoles, b.ClusterSet)
		})
	}
	// Keys are Join(set, kind, name, role): the view's order is the documented one.
	return connect.NewResponse(&placementv1.ListClusterSetRoleBindingsResponse{Bindings: list}), nil
}
