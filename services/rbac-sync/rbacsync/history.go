package rbacsync

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/roles"
)

// replay feeds fn every event of stream stored at or before until, in stream order, and returns
// the sequence of the last one. Streams are kept forever and events carry full state, so the
// fold of a prefix of the log is the state at that moment. The stream's own timestamps (set by
// the server when it stored each message) decide, not the clocks of the writers.
func replay(ctx context.Context, js jetstream.JetStream, stream string, until time.Time, fn func(*events.Event)) (uint64, error) {
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("replay %s: %w", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("replay %s: %w", stream, err)
	}
	end := info.State.LastSeq
	if info.State.Msgs == 0 || !info.State.FirstTime.Before(until) && !info.State.FirstTime.Equal(until) {
		return 0, nil
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		return 0, fmt.Errorf("replay %s: %w", stream, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return 0, fmt.Errorf("replay %s: %w", stream, err)
	}
	defer it.Stop()
	var last uint64
	for {
		if err := ctx.Err(); err != nil {
			return last, err
		}
		m, err := it.Next()
		if err != nil {
			return last, fmt.Errorf("replay %s: %w", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return last, fmt.Errorf("replay %s: %w", stream, err)
		}
		if md.Timestamp.After(until) {
			return last, nil
		}
		last = md.Sequence.Stream
		// Events this reader does not understand are someone else's business; skip them.
		if ev, err := events.DecodeMsg(m); err == nil {
			fn(ev)
		}
		if last >= end {
			return last, nil
		}
	}
}

// history is the state of templates, bindings and namespace ownership at one moment.
type history struct {
	templates map[string]*rbacv1.RoleTemplate
	bindings  map[string]*rbacv1.ProjectRoleBinding
	// places by namespace-binding id.
	places map[string]grantBinding
}

func (h *history) applyRBAC(ev *events.Event) {
	switch p := ev.Payload.(type) {
	case *rbacv1.RoleTemplateCreated:
		h.templates[p.GetTemplate().GetName()] = p.GetTemplate()
	case *rbacv1.RoleTemplateUpdated:
		h.templates[p.GetTemplate().GetName()] = p.GetTemplate()
	case *rbacv1.RoleTemplateDeleted:
		delete(h.templates, p.GetName())
	case *rbacv1.ProjectRoleBound:
		b := proto.CloneOf(p.GetBinding())
		b.CreateTime = ev.GetTime()
		h.bindings[bindingKey(b.Project, b.Subject, b.RoleTemplate)] = b
	case *rbacv1.ProjectRoleUnbound:
		delete(h.bindings, bindingKey(p.GetProject(), p.GetSubject(), p.GetRoleTemplate()))
	}
}

// applyNamespace folds namespace-binding's events: a binding gives its place to the project
// from NamespaceBound until NamespaceUnbinding (when its RoleBindings are removed).
func (h *history) applyNamespace(ev *events.Event) {
	switch p := ev.Payload.(type) {
	case *projectv1.NamespaceBound:
		h.places[p.GetBindingId()] = grantBinding{project: p.GetProject(), place: place{p.GetCluster(), p.GetNamespace()}}
	case *projectv1.NamespaceUnbinding:
		delete(h.places, p.GetBindingId())
	case *projectv1.NamespaceReleased:
		delete(h.places, p.GetBindingId())
	case *projectv1.ProjectDeleted:
		for id, g := range h.places {
			if g.project == p.GetName() {
				delete(h.places, id)
			}
		}
	}
}

func (s *Service) AccessAt(ctx context.Context, req *connect.Request[rbacv1.AccessAtRequest]) (*connect.Response[rbacv1.AccessAtResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateSubject(&v, "subject", m.Subject)
	if m.Time == nil {
		v.Add("time", "required")
	} else if err := m.Time.CheckValid(); err != nil {
		v.Add("time", "%v", err)
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	until := m.Time.AsTime()
	h := &history{templates: map[string]*rbacv1.RoleTemplate{}, bindings: map[string]*rbacv1.ProjectRoleBinding{}, places: map[string]grantBinding{}}
	rbacSeq, err := replay(ctx, s.js, Stream, until, h.applyRBAC)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	nsSeq, err := replay(ctx, s.js, s.cfg.NamespaceStream, until, h.applyNamespace)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	lookup := func(name string) (*rbacv1.RoleTemplate, bool) { t, ok := h.templates[name]; return t, ok }
	placesOf := map[string][]place{}
	for _, g := range h.places {
		placesOf[g.project] = append(placesOf[g.project], g.place)
	}
	id := subjectID(m.Subject)
	caller := authz.CallerFrom(ctx)
	res := &rbacv1.AccessAtResponse{RbacSequence: rbacSeq, ProjectSequence: nsSeq}
	for _, k := range slices.Sorted(maps.Keys(h.bindings)) {
		b := h.bindings[k]
		// A caller sees the history of the projects it may read access in today.
		if subjectID(b.Subject) != id || !caller.Can("get", roles.Group, roles.ResAccess, b.Project) {
			continue
		}
		_, exists := h.templates[b.RoleTemplate]
		var rules []*rbacv1.PolicyRule
		if exists {
			rules = effectiveRules(lookup, b.RoleTemplate)
		}
		for _, pl := range placesOf[b.Project] {
			res.Grants = append(res.Grants, &rbacv1.Grant{
				Subject: b.Subject, Project: b.Project, Cluster: pl.cluster, Namespace: pl.namespace,
				RoleTemplate: b.RoleTemplate, ClusterRole: ObjectName(b.RoleTemplate), RoleBinding: ObjectName(b.RoleTemplate),
				Rules: rules, BoundTime: b.CreateTime, TemplateMissing: !exists,
			})
		}
	}
	sort.SliceStable(res.Grants, func(i, j int) bool {
		a, b := res.Grants[i], res.Grants[j]
		if a.Cluster != b.Cluster {
			return a.Cluster < b.Cluster
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.RoleTemplate < b.RoleTemplate
	})
	return connect.NewResponse(res), nil
}
