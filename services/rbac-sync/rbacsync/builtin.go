package rbacsync

import (
	"context"
	"slices"

	"google.golang.org/protobuf/proto"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// ensureBuiltins creates the built-in project roles, or brings them to this version's rules,
// through the same events an admin's change would append (viewapi.Ensure: replicas starting
// together race on the subject, and the loser finds the winner's template as wanted). Their
// rules are those of this binary: after an upgrade the new rules take effect at once.
func (s *Service) ensureBuiltins(ctx context.Context) error {
	// Parents first, so an inherited template always exists when its heir is written.
	for _, want := range roles.Builtin() {
		if err := viewapi.Ensure(ctx, s.log, viewapi.Builtin[*rbacv1.RoleTemplate]{
			What: "role template " + want.Name, Cache: s.templates, Key: templateKey(want.Name),
			Store: s.store, Stream: s.stream, Subject: TemplateSubject(want.Name), AggregateID: want.Name,
			Ended: func(last proto.Message) bool {
				_, gone := last.(*rbacv1.RoleTemplateDeleted)
				return gone
			},
			Decide: func(cur *rbacv1.RoleTemplate, ok bool) []proto.Message { return decideBuiltin(want, cur, ok) },
		}); err != nil {
			return err
		}
	}
	return nil
}

// decideBuiltin returns what brings template cur (ok false when absent) to want, if anything.
func decideBuiltin(want, cur *rbacv1.RoleTemplate, ok bool) []proto.Message {
	switch {
	case !ok:
		return []proto.Message{&rbacv1.RoleTemplateCreated{Template: want}}
	case cur.DisplayName != want.DisplayName || cur.Locked || !slices.Equal(cur.Inherits, want.Inherits) || !rulesEqual(cur.Rules, want.Rules):
		next := stored(cur)
		next.DisplayName, next.Rules, next.Inherits, next.Locked = want.DisplayName, want.Rules, want.Inherits, false
		return []proto.Message{&rbacv1.RoleTemplateUpdated{Template: next, Fields: []string{"display_name", "rules", "inherits", "locked"}}}
	}
	return nil
}

func rulesEqual(a, b []*rbacv1.PolicyRule) bool {
	return slices.EqualFunc(a, b, func(x, y *rbacv1.PolicyRule) bool { return proto.Equal(x, y) })
}
