package rbacsync

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/paging"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// Fields of a template UpdateRoleTemplate may replace.
var updatableTemplateFields = []string{"display_name", "rules", "inherits", "locked"}

func permissionDenied(format string, args ...any) error {
	return apierr.PermissionDenied(format, args...)
}

func (s *Service) lookup(name string) (*rbacv1.RoleTemplate, bool) {
	return s.templates.Get(templateKey(name))
}

// templateKind is how the handlers read role templates.
func (s *Service) templateKind() viewapi.Kind[*rbacv1.RoleTemplate] {
	return viewapi.Kind[*rbacv1.RoleTemplate]{Name: "role template", Cache: s.templates, Key: templateKey, Gate: s.gate}
}

// present returns a template with its effective rules.
func (s *Service) present(t *rbacv1.RoleTemplate) *rbacv1.RoleTemplate {
	out := proto.CloneOf(t)
	out.EffectiveRules = effectiveRules(s.lookup, t.Name)
	return out
}

// presentAs returns t with its effective rules as they would be were t stored: a dry run's
// answer.
func (s *Service) presentAs(t *rbacv1.RoleTemplate) *rbacv1.RoleTemplate {
	out := proto.CloneOf(t)
	out.EffectiveRules = effectiveRules(func(name string) (*rbacv1.RoleTemplate, bool) {
		if name == t.Name {
			return t, true
		}
		return s.lookup(name)
	}, t.Name)
	return out
}

func (s *Service) CreateRoleTemplate(ctx context.Context, req *connect.Request[rbacv1.CreateRoleTemplateRequest]) (*connect.Response[rbacv1.CreateRoleTemplateResponse], error) {
	t := req.Msg.Template
	var v apierr.Violations
	validateTemplate(&v, "template", t)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if _, ok := s.lookup(t.Name); ok {
		return nil, apierr.AlreadyExists("role template", t.Name)
	}
	if err := s.checkInherits(t.Name, t.Inherits); err != nil {
		return nil, err
	}
	if req.Msg.DryRun {
		return connect.NewResponse(&rbacv1.CreateRoleTemplateResponse{Template: s.presentAs(stored(t)), Plan: s.planTemplate(stored(t))}), nil
	}
	// A name may be reused after deletion: the subject must be empty or end in a deletion.
	seq, err := viewapi.Create(ctx, s.store, s.stream, TemplateSubject(t.Name), t.Name,
		func(last proto.Message) bool { _, gone := last.(*rbacv1.RoleTemplateDeleted); return gone },
		&rbacv1.RoleTemplateCreated{Template: stored(t)}, apierr.AlreadyExists("role template", t.Name))
	if err != nil {
		return nil, err
	}
	out, err := s.awaitTemplate(ctx, t.Name, seq)
	if err != nil {
		return nil, err
	}
	s.log.Info("role template created", zap.String("template", t.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&rbacv1.CreateRoleTemplateResponse{Template: out}), nil
}

// checkInherits verifies that every inherited template exists and that inheriting them from
// template name creates no cycle, naming the offending `inherits[i]`.
func (s *Service) checkInherits(name string, inherits []string) error {
	var v apierr.Violations
	override := map[string][]string{name: inherits}
	for i, p := range inherits {
		f := fmt.Sprintf("template.inherits[%d]", i)
		if _, ok := s.lookup(p); !ok {
			v.Add(f, "role template %q not found", p)
			continue
		}
		if path := reaches(s.lookup, p, name, override); path != nil {
			v.Add(f, "inheriting %q creates a cycle: %s", p, strings.Join(append([]string{name}, path...), " → "))
		}
	}
	return v.Err()
}

func (s *Service) UpdateRoleTemplate(ctx context.Context, req *connect.Request[rbacv1.UpdateRoleTemplateRequest]) (*connect.Response[rbacv1.UpdateRoleTemplateResponse], error) {
	m := req.Msg
	var v apierr.Violations
	if m.Template == nil {
		v.Add("template", "required")
		return nil, v.Err()
	}
	v.DNSLabel("template.name", m.Template.Name)
	fields := m.GetUpdateMask().GetPaths()
	if len(fields) == 0 {
		v.Add("update_mask", "name at least one of %s", strings.Join(updatableTemplateFields, ", "))
	}
	for i, f := range fields {
		if !slices.Contains(updatableTemplateFields, f) {
			v.Add(fmt.Sprintf("update_mask.paths[%d]", i), "%q cannot be updated (%s)", f, strings.Join(updatableTemplateFields, ", "))
		}
	}
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	name := m.Template.Name
	if err := refuseBuiltin(name, "updated"); err != nil {
		return nil, err
	}
	res, err := events.Command[*rbacv1.RoleTemplate]{
		Store: s.store, Subject: TemplateSubject(name), AggregateID: name,
		Load: s.templateKind().Load(name, m.ExpectedRevision), Expected: m.ExpectedRevision, DryRun: m.DryRun,
		Decide: func(cur *rbacv1.RoleTemplate) ([]proto.Message, error) {
			next := stored(cur)
			for _, f := range fields {
				switch f {
				case "display_name":
					next.DisplayName = m.Template.DisplayName
				case "rules":
					next.Rules = m.Template.Rules
				case "inherits":
					next.Inherits = m.Template.Inherits
				case "locked":
					next.Locked = m.Template.Locked
				}
			}
			var v apierr.Violations
			validateTemplate(&v, "template", next)
			if err := v.Err(); err != nil {
				return nil, err
			}
			if err := s.checkInherits(name, next.Inherits); err != nil {
				return nil, err
			}
			if proto.Equal(next, stored(cur)) {
				return nil, nil
			}
			return []proto.Message{&rbacv1.RoleTemplateUpdated{Template: next, Fields: fields}}, nil
		},
	}.Run(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if len(res.Events) == 0 {
		return connect.NewResponse(&rbacv1.UpdateRoleTemplateResponse{Template: s.present(res.State)}), nil
	}
	if m.DryRun {
		next := proto.CloneOf(res.Events[0].(*rbacv1.RoleTemplateUpdated).Template)
		next.Revision, next.CreateTime, next.Creator = res.State.Revision, res.State.CreateTime, res.State.Creator
		return connect.NewResponse(&rbacv1.UpdateRoleTemplateResponse{Template: s.presentAs(next), Plan: s.planTemplate(next)}), nil
	}
	out, err := s.awaitTemplate(ctx, name, res.Sequence)
	if err != nil {
		return nil, err
	}
	s.log.Info("role template updated", zap.String("template", name), zap.Strings("fields", fields), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&rbacv1.UpdateRoleTemplateResponse{Template: out}), nil
}

func (s *Service) DeleteRoleTemplate(ctx context.Context, req *connect.Request[rbacv1.DeleteRoleTemplateRequest]) (*connect.Response[rbacv1.DeleteRoleTemplateResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if err := refuseBuiltin(m.Name, "deleted"); err != nil {
		return nil, err
	}
	templates := s.templateKind()
	load := func() (*rbacv1.RoleTemplate, error) {
		cur, err := templates.Current(m.Name, m.ExpectedRevision)
		if err != nil {
			return nil, err
		}
		// Deleting an inherited template would silently shrink what its heirs grant.
		var heirs []string
		for _, t := range s.templates.List(nil) {
			if slices.Contains(t.Inherits, m.Name) {
				heirs = append(heirs, t.Name)
			}
		}
		if len(heirs) > 0 {
			return nil, apierr.FailedPrecondition("role template %q is inherited by %s: remove it from their inherits first", m.Name, strings.Join(heirs, ", "))
		}
		return cur, nil
	}
	if m.DryRun {
		if _, err := load(); err != nil {
			return nil, err
		}
		return connect.NewResponse(&rbacv1.DeleteRoleTemplateResponse{}), nil
	}
	cur, err := viewapi.Remove(ctx, s.store, TemplateSubject(m.Name), m.Name, load,
		func(*rbacv1.RoleTemplate) proto.Message { return &rbacv1.RoleTemplateDeleted{Name: m.Name} }, nil)
	if err != nil {
		return nil, err
	}
	if err := templates.AwaitPast(ctx, m.Name, cur.Revision); err != nil {
		return nil, err
	}
	s.log.Info("role template deleted", zap.String("template", m.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&rbacv1.DeleteRoleTemplateResponse{}), nil
}

func (s *Service) GetRoleTemplate(ctx context.Context, req *connect.Request[rbacv1.GetRoleTemplateRequest]) (*connect.Response[rbacv1.GetRoleTemplateResponse], error) {
	t, err := s.templateKind().Get(ctx, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&rbacv1.GetRoleTemplateResponse{Template: s.present(t)}), nil
}

func (s *Service) ListRoleTemplates(ctx context.Context, _ *connect.Request[rbacv1.ListRoleTemplatesRequest]) (*connect.Response[rbacv1.ListRoleTemplatesResponse], error) {
	list, err := s.templateKind().List(ctx, nil)
	if err != nil {
		return nil, err
	}
	res := &rbacv1.ListRoleTemplatesResponse{Templates: make([]*rbacv1.RoleTemplate, len(list))}
	for i, t := range list {
		res.Templates[i] = s.present(t)
	}
	return connect.NewResponse(res), nil
}

func (s *Service) awaitTemplate(ctx context.Context, name string, seq uint64) (*rbacv1.RoleTemplate, error) {
	t, _, err := s.templateKind().Await(ctx, name, seq)
	if err != nil {
		return nil, err
	}
	return s.present(t), nil
}

func validateBindingRef(v *apierr.Violations, prefix, project string, subject *rbacv1.Subject, role string) {
	v.DNSLabel(prefix+"project", project)
	validateSubject(v, prefix+"subject", subject)
	v.DNSLabel(prefix+"role_template", role)
}

// authorizeBinding applies the escalation rule of Kubernetes RBAC to project role bindings.
// The authorization table has already required the right to manage RoleBindings in the
// project; to grant a template a caller who is not a platform admin must also hold every rule
// of it there (or be allowed to `bind` its ClusterRole), so no one hands out more than they
// have.
func (s *Service) authorizeBinding(ctx context.Context, project string, t *rbacv1.RoleTemplate) error {
	caller := authz.CallerFrom(ctx)
	if caller.Admin() {
		return nil
	}
	held := caller.Rules(project)
	bind := &rbacv1.PolicyRule{Verbs: []string{"bind"}, ApiGroups: []string{rbacGroup}, Resources: []string{"clusterroles"}, ResourceNames: []string{ObjectName(t.Name)}}
	if ok, _ := covers(held, []*rbacv1.PolicyRule{bind}); ok {
		return nil
	}
	if ok, missing := covers(held, effectiveRules(s.lookup, t.Name)); !ok {
		shown := make([]string, 0, 3)
		for _, r := range missing[:min(3, len(missing))] {
			shown = append(shown, formatRule(r))
		}
		more := ""
		if len(missing) > 3 {
			more = fmt.Sprintf(" and %d more", len(missing)-3)
		}
		return permissionDenied("user %q may not grant role template %q in project %q: it does not hold %s%s there (no privilege escalation)",
			caller.User(), t.Name, project, strings.Join(shown, ", "), more)
	}
	return nil
}

// refuseBuiltin refuses to change the built-in project roles: the authorization of the API
// itself rests on them.
func refuseBuiltin(name, what string) error {
	if roles.IsBuiltin(name) {
		return apierr.FailedPrecondition("role template %q is built in and cannot be %s", name, what)
	}
	return nil
}

func (s *Service) BindProjectRole(ctx context.Context, req *connect.Request[rbacv1.BindProjectRoleRequest]) (*connect.Response[rbacv1.BindProjectRoleResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateBindingRef(&v, "", m.Project, m.Subject, m.RoleTemplate)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	t, ok := s.lookup(m.RoleTemplate)
	if !ok {
		return nil, apierr.NotFound("role template", m.RoleTemplate)
	}
	if err := s.authorizeBinding(ctx, m.Project, t); err != nil {
		return nil, err
	}
	if t.Locked {
		return nil, apierr.FailedPrecondition("role template %q is locked: it accepts no new bindings", t.Name)
	}
	key := bindingKey(m.Project, m.Subject, m.RoleTemplate)
	if _, ok := s.bindings.Get(key); ok {
		return nil, apierr.AlreadyExists("project role binding", describeBinding(m.Project, m.Subject, m.RoleTemplate))
	}
	plan := s.fan.planBinding(m.Project, m.RoleTemplate, m.Subject, true)
	b := &rbacv1.ProjectRoleBinding{Project: m.Project, Subject: m.Subject, RoleTemplate: m.RoleTemplate}
	if m.DryRun {
		b.Creator, b.CreateTime = identity.ActorFrom(ctx), timestamppb.New(s.now())
		return connect.NewResponse(&rbacv1.BindProjectRoleResponse{Binding: b, Plan: plan}), nil
	}
	seq, err := viewapi.Create(ctx, s.store, s.stream, BindingSubject(m.Project, m.Subject, m.RoleTemplate), key,
		func(last proto.Message) bool { _, gone := last.(*rbacv1.ProjectRoleUnbound); return gone },
		&rbacv1.ProjectRoleBound{Binding: b}, apierr.AlreadyExists("project role binding", describeBinding(m.Project, m.Subject, m.RoleTemplate)))
	if err != nil {
		return nil, err
	}
	out, _, err := viewapi.Await(ctx, s.bindings, key, seq)
	if err != nil {
		return nil, err
	}
	s.log.Info("project role bound", zap.String("project", m.Project), zap.String("subject", subjectID(m.Subject)),
		zap.String("template", m.RoleTemplate), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&rbacv1.BindProjectRoleResponse{Binding: out, Plan: plan}), nil
}

func (s *Service) UnbindProjectRole(ctx context.Context, req *connect.Request[rbacv1.UnbindProjectRoleRequest]) (*connect.Response[rbacv1.UnbindProjectRoleResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateBindingRef(&v, "", m.Project, m.Subject, m.RoleTemplate)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	key := bindingKey(m.Project, m.Subject, m.RoleTemplate)
	cur, ok := s.bindings.Get(key)
	if !ok {
		return nil, apierr.NotFound("project role binding", describeBinding(m.Project, m.Subject, m.RoleTemplate))
	}
	plan := s.fan.planBinding(m.Project, m.RoleTemplate, m.Subject, false)
	if m.DryRun {
		return connect.NewResponse(&rbacv1.UnbindProjectRoleResponse{Plan: plan}), nil
	}
	if _, err := viewapi.Remove(ctx, s.store, BindingSubject(m.Project, m.Subject, m.RoleTemplate), key,
		func() (*rbacv1.ProjectRoleBinding, error) { return cur, nil },
		func(*rbacv1.ProjectRoleBinding) proto.Message {
			return &rbacv1.ProjectRoleUnbound{Project: m.Project, Subject: m.Subject, RoleTemplate: m.RoleTemplate}
		}, nil); err != nil {
		return nil, err
	}
	if err := viewapi.AwaitPast(ctx, s.bindings, key, cur.Revision); err != nil {
		return nil, err
	}
	s.log.Info("project role unbound", zap.String("project", m.Project), zap.String("subject", subjectID(m.Subject)),
		zap.String("template", m.RoleTemplate), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&rbacv1.UnbindProjectRoleResponse{Plan: plan}), nil
}

func describeBinding(project string, s *rbacv1.Subject, role string) string {
	return fmt.Sprintf("%s/%s:%s", project, formatSubject(s), role)
}

func formatSubject(s *rbacv1.Subject) string {
	if s.GetNamespace() != "" {
		return kindToken(s.GetKind()) + ":" + s.GetNamespace() + ":" + s.GetName()
	}
	return kindToken(s.GetKind()) + ":" + s.GetName()
}

func (s *Service) ListProjectRoleBindings(ctx context.Context, req *connect.Request[rbacv1.ListProjectRoleBindingsRequest]) (*connect.Response[rbacv1.ListProjectRoleBindingsResponse], error) {
	m := req.Msg
	var v apierr.Violations
	page := paging.Parse(&v, paging.Request{PageSize: m.PageSize, PageToken: m.PageToken, List: "ListProjectRoleBindings",
		Filters: []string{m.Project, m.RoleTemplate, m.GetSubject().GetKind().String(), m.GetSubject().GetNamespace(), m.GetSubject().GetName()}})
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	caller := authz.CallerFrom(ctx)
	// What the caller may read is filtered before paging, so a page holds page_size bindings
	// it may read (not fewer for the ones it may not) and its token names one of them.
	list := s.bindings.Entries(func(_ string, b *rbacv1.ProjectRoleBinding) bool {
		if m.Project != "" && b.Project != m.Project || m.RoleTemplate != "" && b.RoleTemplate != m.RoleTemplate {
			return false
		}
		if !caller.Can("list", roles.Group, roles.ResMembers, b.Project) {
			return false
		}
		if f := m.Subject; f != nil {
			if f.Kind != rbacv1.SubjectKind_SUBJECT_KIND_UNSPECIFIED && f.Kind != b.Subject.GetKind() ||
				f.Name != "" && f.Name != b.Subject.GetName() || f.Namespace != "" && f.Namespace != b.Subject.GetNamespace() {
				return false
			}
		}
		return true
	})
	entries, next := paging.Slice(page, list, func(e view.Entry[*rbacv1.ProjectRoleBinding]) string { return e.Key })
	res := &rbacv1.ListProjectRoleBindingsResponse{Bindings: make([]*rbacv1.ProjectRoleBinding, len(entries)), NextPageToken: next}
	for i, e := range entries {
		res.Bindings[i] = e.Value
	}
	return connect.NewResponse(res), nil
}

func (s *Service) GetPropagationStatus(ctx context.Context, req *connect.Request[rbacv1.GetPropagationStatusRequest]) (*connect.Response[rbacv1.GetPropagationStatusResponse], error) {
	var v apierr.Violations
	var entries []*written
	switch t := req.Msg.Target.(type) {
	case *rbacv1.GetPropagationStatusRequest_RoleTemplate:
		v.DNSLabel("role_template", t.RoleTemplate)
		if err := s.gate.Admit(ctx, &v); err != nil {
			return nil, err
		}
		entries = s.fan.templateEntries(t.RoleTemplate)
	case *rbacv1.GetPropagationStatusRequest_Binding:
		b := t.Binding
		validateBindingRef(&v, "binding.", b.GetProject(), b.GetSubject(), b.GetRoleTemplate())
		if err := s.gate.Admit(ctx, &v); err != nil {
			return nil, err
		}
		if _, ok := s.bindings.Get(bindingKey(b.Project, b.Subject, b.RoleTemplate)); !ok {
			return nil, apierr.NotFound("project role binding", describeBinding(b.Project, b.Subject, b.RoleTemplate))
		}
		entries = s.fan.bindingEntries(b.Project, b.RoleTemplate)
	default:
		v.Add("target", "give role_template or binding")
		return nil, v.Err()
	}
	res := &rbacv1.GetPropagationStatusResponse{}
	for _, w := range entries {
		cp := &rbacv1.ClusterPropagation{Cluster: w.t.cluster, Kind: w.t.kind(), Namespace: w.t.namespace, Name: ObjectName(w.t.template),
			DesiredRevision: w.revision, Tombstone: w.tombstone}
		if st, ok := s.status.Get(appliedPrefix + w.t.key()); ok {
			cp.AppliedRevision, cp.Phase, cp.Reason, cp.Message, cp.ReportTime = st.DesiredRevision, st.Phase, st.Reason, st.Message, st.Time
		}
		cp.UpToDate = cp.AppliedRevision >= cp.DesiredRevision && cp.Phase == desiredv1.Phase_PHASE_APPLIED
		switch {
		case cp.UpToDate:
			res.UpToDate++
		case cp.Phase == desiredv1.Phase_PHASE_FAILED:
			res.Failed++
		default:
			res.Pending++
		}
		res.Clusters = append(res.Clusters, cp)
	}
	return connect.NewResponse(res), nil
}

func (s *Service) WhoCan(ctx context.Context, req *connect.Request[rbacv1.WhoCanRequest]) (*connect.Response[rbacv1.WhoCanResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("cluster", m.Cluster)
	v.DNSLabel("namespace", m.Namespace)
	if (m.Verb == "") != (m.Resource == "") {
		v.Add("verb", "give verb and resource together, or neither")
	}
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	project, grants := s.fan.grantsAt(place{m.Cluster, m.Namespace})
	if m.Verb != "" {
		grants = slices.DeleteFunc(grants, func(g *rbacv1.Grant) bool { return !allows(g.Rules, m.Verb, m.ApiGroup, m.Resource) })
	}
	return connect.NewResponse(&rbacv1.WhoCanResponse{Project: project, Grants: grants}), nil
}

// planTemplate lists the ClusterRoles that storing next as its template would create or
// update, per registered cluster: next's own (created when the template is new), and those of
// the templates inheriting it whose effective rules change. A ClusterRole is its template's
// effective rules (model.desired), so nothing else changes one; RoleBindings name the
// ClusterRole and change only when a template appears or goes.
func (s *Service) planTemplate(next *rbacv1.RoleTemplate) []*rbacv1.PlannedChange {
	_, existed := s.lookup(next.Name)
	after := func(name string) (*rbacv1.RoleTemplate, bool) {
		if name == next.Name {
			return next, true
		}
		return s.lookup(name)
	}
	all := s.templates.List(nil)
	affected := []string{next.Name}
	for i := 0; i < len(affected); i++ {
		for _, t := range all {
			if slices.Contains(t.Inherits, affected[i]) && !slices.Contains(affected, t.Name) {
				affected = append(affected, t.Name)
			}
		}
	}
	type change struct {
		template string
		action   rbacv1.ChangeAction
	}
	var changes []change
	for _, name := range affected {
		switch {
		case name == next.Name && !existed:
			changes = append(changes, change{name, rbacv1.ChangeAction_CHANGE_ACTION_CREATE})
		case !slices.EqualFunc(effectiveRules(s.lookup, name), effectiveRules(after, name), func(a, b *rbacv1.PolicyRule) bool { return proto.Equal(a, b) }):
			changes = append(changes, change{name, rbacv1.ChangeAction_CHANGE_ACTION_UPDATE})
		}
	}
	var plan []*rbacv1.PlannedChange
	for _, c := range s.fan.registeredClusters() {
		for _, ch := range changes {
			plan = append(plan, &rbacv1.PlannedChange{Cluster: c, Name: ObjectName(ch.template), Action: ch.action})
		}
	}
	return plan
}

// registeredClusters returns the clusters the fan-out writes to, sorted.
func (f *fanout) registeredClusters() []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]string, 0, len(f.m.clusters))
	for c := range f.m.clusters {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// planBinding lists the RoleBindings that adding (or removing) subject's binding to role in
// project would create, change or delete, per cluster, from the current model. It compares
// subject lists rather than building manifests: a RoleBinding exists exactly when its cluster
// is registered, its template exists and its list is not empty (see model.desired).
func (f *fanout) planBinding(project, role string, subject *rbacv1.Subject, add bool) []*rbacv1.PlannedChange {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if _, ok := f.m.templates[role]; !ok {
		return nil
	}
	before := f.m.subjects(project, role)
	id := subjectID(subject)
	after := slices.DeleteFunc(slices.Clone(before), func(s *rbacv1.Subject) bool { return subjectID(s) == id })
	if add {
		after = sortSubjects(append(after, subject))
	}
	action := rbacv1.ChangeAction_CHANGE_ACTION_UPDATE
	switch {
	case len(before) == len(after):
		return nil
	case len(before) == 0:
		action = rbacv1.ChangeAction_CHANGE_ACTION_CREATE
	case len(after) == 0:
		action = rbacv1.ChangeAction_CHANGE_ACTION_DELETE
	}
	var plan []*rbacv1.PlannedChange
	for _, t := range f.m.roleTargets(project, role) {
		if !f.m.clusters[t.cluster] || f.m.owner[t.place()] != project {
			continue
		}
		plan = append(plan, &rbacv1.PlannedChange{Cluster: t.cluster, Namespace: t.namespace, Name: ObjectName(role),
			Action: action, SubjectsBefore: before, SubjectsAfter: after})
	}
	sort.Slice(plan, func(i, j int) bool {
		if plan[i].Cluster != plan[j].Cluster {
			return plan[i].Cluster < plan[j].Cluster
		}
		return plan[i].Namespace < plan[j].Namespace
	})
	return plan
}

// templateEntries returns what the desired state holds for template's ClusterRoles.
func (f *fanout) templateEntries(template string) []*written {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []*written
	for c := range f.writtenByCluster {
		if w, ok := f.written[target{cluster: c, template: template}.key()]; ok {
			out = append(out, w)
		}
	}
	sortWritten(out)
	return out
}

// bindingEntries returns what the desired state holds for the RoleBindings of role in every
// place of project.
func (f *fanout) bindingEntries(project, role string) []*written {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []*written
	for _, t := range f.m.roleTargets(project, role) {
		if w, ok := f.written[t.key()]; ok {
			out = append(out, w)
		}
	}
	sortWritten(out)
	return out
}

func sortWritten(ws []*written) {
	sort.Slice(ws, func(i, j int) bool {
		if ws[i].t.cluster != ws[j].t.cluster {
			return ws[i].t.cluster < ws[j].t.cluster
		}
		return ws[i].t.namespace < ws[j].t.namespace
	})
}

func (f *fanout) grantsAt(pl place) (string, []*rbacv1.Grant) {
	// The model's rule memo is written on read: take the write lock.
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m.grantsAt(pl)
}
