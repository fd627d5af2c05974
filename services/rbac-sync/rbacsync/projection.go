package rbacsync

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/topology"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Stream, subjects and buckets rbac-sync owns (single writer of each).
const (
	Stream          = subjects.RBACStream
	SubjectPrefix   = subjects.RBACPrefix
	templatePrefix  = SubjectPrefix + ".roletemplate"
	bindingPrefix   = SubjectPrefix + ".binding"
	TemplatesBucket = subjects.RBACTemplatesBucket
	BindingsBucket  = subjects.RBACBindingsBucket
)

// TemplateSubject is the subject of template name's events.
func TemplateSubject(name string) string { return templatePrefix + "." + keys.Encode(name) }

// BindingSubject is the subject of one project role binding's events: the binding's identity
// is (project, subject, role), so binding twice is a conflict on one subject.
func BindingSubject(project string, s *rbacv1.Subject, role string) string {
	return bindingPrefix + "." + bindingKey(project, s, role)
}

func templateKey(name string) string { return keys.Encode(name) }

func bindingKey(project string, s *rbacv1.Subject, role string) string {
	return keys.Join(project, kindToken(s.GetKind()), s.GetNamespace(), s.GetName(), role)
}

func kindToken(k rbacv1.SubjectKind) string {
	switch k {
	case rbacv1.SubjectKind_SUBJECT_KIND_USER:
		return "User"
	case rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		return "Group"
	case rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT:
		return "ServiceAccount"
	}
	return "Unspecified"
}

func bucketConfig(name, desc string) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: name, Description: desc, History: 1, Storage: jetstream.FileStorage}
}

// eventStream is FLEET_RBAC: kept forever, it is the source of truth and what AccessAt replays.
func eventStream() jetstream.StreamConfig {
	return topology.EventStream(Stream, "Role templates and project role bindings.", SubjectPrefix+".>")
}

// templatesProjection folds template events into bucket rbac-templates. Bump Version whenever
// applyTemplateEvent changes meaning.
func templatesProjection() view.Projection {
	return view.Projection{
		Name: TemplatesBucket, Version: 1, Stream: Stream, Subjects: []string{templatePrefix + ".>"},
		Bucket: bucketConfig(TemplatesBucket, "Role templates (projection of FLEET_RBAC)."),
		New:    func() proto.Message { return &rbacv1.RoleTemplate{} },
		Apply:  applyTemplateEvent,
	}
}

func applyTemplateEvent(ev *events.Event) ([]view.Change, error) {
	name, err := keys.Decode(strings.TrimPrefix(ev.Subject, templatePrefix+"."))
	if err != nil {
		return nil, fmt.Errorf("template subject %s: %w", ev.Subject, err)
	}
	change := func(f func(cur *rbacv1.RoleTemplate) *rbacv1.RoleTemplate) []view.Change {
		return []view.Change{view.ChangeOf(templateKey(name), f)}
	}
	switch p := ev.Payload.(type) {
	case *rbacv1.RoleTemplateCreated:
		if p.GetTemplate().GetName() != name {
			return nil, fmt.Errorf("RoleTemplateCreated for %q on subject of %q", p.GetTemplate().GetName(), name)
		}
		return change(func(*rbacv1.RoleTemplate) *rbacv1.RoleTemplate {
			t := stored(p.Template)
			t.CreateTime, t.UpdateTime, t.Creator, t.Updater = ev.GetTime(), ev.GetTime(), ev.GetActor(), ev.GetActor()
			return t
		}), nil
	case *rbacv1.RoleTemplateUpdated:
		if p.GetTemplate().GetName() != name {
			return nil, fmt.Errorf("RoleTemplateUpdated for %q on subject of %q", p.GetTemplate().GetName(), name)
		}
		return change(func(cur *rbacv1.RoleTemplate) *rbacv1.RoleTemplate {
			if cur == nil {
				return nil
			}
			t := stored(p.Template)
			t.CreateTime, t.Creator = cur.CreateTime, cur.Creator
			t.UpdateTime, t.Updater = ev.GetTime(), ev.GetActor()
			return t
		}), nil
	case *rbacv1.RoleTemplateDeleted:
		return change(func(*rbacv1.RoleTemplate) *rbacv1.RoleTemplate { return nil }), nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.GetType(), ev.Subject)
}

// stored is the part of a template the view keeps: what the user gave, not computed fields.
func stored(t *rbacv1.RoleTemplate) *rbacv1.RoleTemplate {
	return &rbacv1.RoleTemplate{Name: t.Name, DisplayName: t.DisplayName, Rules: t.Rules, Inherits: t.Inherits, Locked: t.Locked}
}

// bindingsProjection folds binding events into bucket rbac-bindings.
func bindingsProjection() view.Projection {
	return view.Projection{
		Name: BindingsBucket, Version: 1, Stream: Stream, Subjects: []string{bindingPrefix + ".>"},
		Bucket: bucketConfig(BindingsBucket, "Project role bindings (projection of FLEET_RBAC)."),
		New:    func() proto.Message { return &rbacv1.ProjectRoleBinding{} },
		Apply:  applyBindingEvent,
	}
}

func applyBindingEvent(ev *events.Event) ([]view.Change, error) {
	key := strings.TrimPrefix(ev.Subject, bindingPrefix+".")
	switch p := ev.Payload.(type) {
	case *rbacv1.ProjectRoleBound:
		b := p.GetBinding()
		if bindingKey(b.GetProject(), b.GetSubject(), b.GetRoleTemplate()) != key {
			return nil, fmt.Errorf("ProjectRoleBound of %s on subject %s", bindingKey(b.GetProject(), b.GetSubject(), b.GetRoleTemplate()), ev.Subject)
		}
		return []view.Change{{Key: key, Update: func(proto.Message) proto.Message {
			return &rbacv1.ProjectRoleBinding{Project: b.Project, Subject: b.Subject, RoleTemplate: b.RoleTemplate,
				CreateTime: ev.GetTime(), Creator: ev.GetActor()}
		}}}, nil
	case *rbacv1.ProjectRoleUnbound:
		return []view.Change{{Key: key, Update: func(proto.Message) proto.Message { return nil }}}, nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.GetType(), ev.Subject)
}
