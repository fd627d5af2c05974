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

// errHistoryGone means events a fold needs were removed from the stream (retention or purge).
var errHistoryGone = errors.New("events no longer in the stream")

// folded is how far a fold of a stream's prefix got: the sequence of its last event (0 for the
// empty prefix) and the latest stored time among its events (the fold is the state at every
// moment from then until the next event's).
type folded struct {
	seq     uint64
	maxTime time.Time
}

// replay feeds fn the events of stream from sequence from on, in stream order, up to the first
// one stored after until, and returns how far the fold got (starting from prev, what the caller
// folded before from). Events carry full state, so the fold of a prefix of the log is the state
// at that moment. The stream's own timestamps (set by the server when it stored each message)
// decide, not the clocks of the writers. It fails with errHistoryGone when the stream no longer
// holds sequence from.
func replay(ctx context.Context, js jetstream.JetStream, stream string, prev folded, until time.Time, fn func(*events.Event)) (folded, error) {
	from := prev.seq + 1
	st, err := js.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return prev, nil
	}
	if err != nil {
		return prev, fmt.Errorf("replay %s: %w", stream, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return prev, fmt.Errorf("replay %s: %w", stream, err)
	}
	end := info.State.LastSeq
	if end < from {
		return prev, nil
	}
	if info.State.FirstSeq > from {
		return prev, fmt.Errorf("replay %s from %d: the stream starts at %d: %w", stream, from, info.State.FirstSeq, errHistoryGone)
	}
	if from == 1 && info.State.FirstTime.After(until) {
		return prev, nil
	}
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if from > 1 {
		cfg = jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from}
	}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return prev, fmt.Errorf("replay %s: %w", stream, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return prev, fmt.Errorf("replay %s: %w", stream, err)
	}
	defer it.Stop()
	got := prev
	for {
		if err := ctx.Err(); err != nil {
			return got, err
		}
		m, err := it.Next()
		if err != nil {
			return got, fmt.Errorf("replay %s: %w", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return got, fmt.Errorf("replay %s: %w", stream, err)
		}
		if got.seq == prev.seq && md.Sequence.Stream > from {
			// Removed between the stream's info and the consumer's start.
			return got, fmt.Errorf("replay %s from %d: the stream starts at %d: %w", stream, from, md.Sequence.Stream, errHistoryGone)
		}
		if md.Timestamp.After(until) {
			return got, nil
		}
		got.seq = md.Sequence.Stream
		if md.Timestamp.After(got.maxTime) {
			got.maxTime = md.Timestamp
		}
		// Events this reader does not understand are someone else's business; skip them.
		if ev, err := events.DecodeMsg(m); err == nil {
			fn(ev)
		}
		if got.seq >= end {
			return got, nil
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
	h, rbacSeq, nsSeq, err := s.historyAt(ctx, until)
	if err != nil {
		return nil, err
	}
	lookup := func(name string) (*rbacv1.RoleTemplate, bool) { t, ok := h.templates[name]; return t, ok }
	placesOf := map[string][]place{}
	for _, g := range h.places {
		placesOf[g.project] = append(placesOf[g.project], g.place)
	}
	id := subjectID(m.Subject)
	caller := authz.CallerFrom(ctx)
	res := &rbacv1.AccessAtResponse{}
	// The positions count every tenant's changes fleet-wide: how busy other projects are is not
	// a project member's business, so only platform admins get them.
	if caller.Admin() {
		res.RbacSequence, res.ProjectSequence = rbacSeq, nsSeq
	}
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
