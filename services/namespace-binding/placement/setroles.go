package placement

import (
	"context"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// Cluster set roles (docs/placement.md, "Cluster set roles"): one aggregate per binding,
// subject fleet.placement.setrole.<set>.<kind>.<name>.<role>, folded into bucket
// placement-clusterset-roles under the same key. pkg/authz reads that view to decide what a
// set's admins and viewers may do; this service only records the bindings.
const ClusterSetRolesBucket = subjects.ClusterSetRolesBucket

const setRolePrefix = SubjectPrefix + ".setrole."

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

func bySet(set string) string { return "s\x00" + set }

func setRoleIndex(_ string, b *placementv1.ClusterSetRoleBinding) []string {
	return []string{bySet(b.ClusterSet)}
}

// setRolesProjection folds the set role subjects into bucket placement-clusterset-roles.
func setRolesProjection() view.Projection {
	return view.Projection{
		Name:     ClusterSetRolesBucket,
		Version:  1,
		Stream:   Stream,
		Subjects: []string{setRolePrefix + ">"},
		Bucket:   bucketConfig(ClusterSetRolesBucket, "Cluster set role bindings (projection of FLEET_PLACEMENT)."),
		New:      func() proto.Message { return &placementv1.ClusterSetRoleBinding{} },
		Apply:    applySetRole,
	}
}

func applySetRole(ev *events.Event) ([]view.Change, error) {
	key, ok := strings.CutPrefix(ev.Subject, setRolePrefix)
	if !ok {
		return nil, fmt.Errorf("subject %s is not a set role binding's", ev.Subject)
	}
	if parts, err := keys.Split(key); err != nil || len(parts) != 4 {
		return nil, fmt.Errorf("subject %s is not a set role binding's: %v", ev.Subject, err)
	}
	switch p := ev.Payload.(type) {
	case *placementv1.ClusterSetRoleBound:
		b := p.GetBinding()
		if k := setRoleKey(b.GetClusterSet(), b.GetSubject(), b.GetRole()); k != key {
			return nil, fmt.Errorf("ClusterSetRoleBound of %s on subject %s", k, ev.Subject)
		}
		return []view.Change{{Key: key, Update: func(proto.Message) proto.Message {
			return &placementv1.ClusterSetRoleBinding{ClusterSet: b.ClusterSet, Subject: b.Subject, Role: b.Role,
				CreateTime: ev.GetTime(), Creator: ev.GetActor()}
		}}}, nil
	case *placementv1.ClusterSetRoleUnbound:
		return []view.Change{{Key: key, Update: func(proto.Message) proto.Message { return nil }}}, nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.GetType(), ev.Subject)
}

// validateSetRoleRef checks a set role binding's identity, with field paths.
func validateSetRoleRef(v *apierr.Violations, set string, s *rbacv1.Subject, role string) {
	v.DNSLabel("cluster_set", set)
	switch {
	case s == nil:
		v.Add("subject", "required")
	case s.Kind != rbacv1.SubjectKind_SUBJECT_KIND_USER && s.Kind != rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		// A service account is a Kubernetes identity: it never calls Fleetstream's API.
		v.Add("subject.kind", "USER or GROUP: set roles are rights on Fleetstream's API")
	default:
		if strings.TrimSpace(s.Name) == "" {
			v.Add("subject.name", "required")
		} else if len(s.Name) > 253 {
			v.Add("subject.name", "at most 253 characters")
		}
		if s.Namespace != "" {
			v.Add("subject.namespace", "only a ServiceAccount has a namespace")
		}
	}
	if _, ok := roles.ClusterSetRoleRules(role); !ok {
		v.Add("role", "%q is not a set role: %s or %s", role, roles.ClusterSetAdmin, roles.ClusterSetView)
	}
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
