package rbacsync

import (
	"context"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// ensureBuiltins creates the built-in project roles, or brings them to this version's rules,
// through the same events an admin's change would append. Replicas starting together race on
// the subject's last sequence; the loser sees the winner's template and has nothing to do.
// Their rules are those of this binary: after an upgrade the new rules take effect at once.
func (s *Service) ensureBuiltins(ctx context.Context) error {
	// Parents first, so an inherited template always exists when its heir is written.
	for _, want := range roles.Builtin() {
		if err := viewapi.Ensure(ctx, s.templates, templateKey(want.Name), "role template "+want.Name, s.log, func(cur *rbacv1.RoleTemplate, ok bool) (uint64, error) {
			return s.ensureBuiltin(ctx, want, cur, ok)
		}); err != nil {
			return err
		}
	}
	return nil
}

// ensureBuiltin appends what brings template cur (ok false when absent) to want, if anything.
func (s *Service) ensureBuiltin(ctx context.Context, want, cur *rbacv1.RoleTemplate, ok bool) (uint64, error) {
	subject := TemplateSubject(want.Name)
	switch {
	case !ok:
		last, err := events.LastSequence(ctx, s.stream, subject)
		if err != nil {
			return 0, err
		}
		return s.store.Append(ctx, subject, want.Name, events.At(last), &rbacv1.RoleTemplateCreated{Template: want})
	case cur.DisplayName != want.DisplayName || cur.Locked || !slices.Equal(cur.Inherits, want.Inherits) || !rulesEqual(cur.Rules, want.Rules):
		next := stored(cur)
		next.DisplayName, next.Rules, next.Inherits, next.Locked = want.DisplayName, want.Rules, want.Inherits, false
		return s.store.Append(ctx, subject, want.Name, events.At(cur.Revision),
			&rbacv1.RoleTemplateUpdated{Template: next, Fields: []string{"display_name", "rules", "inherits", "locked"}})
	}
	return 0, nil
}

func rulesEqual(a, b []*rbacv1.PolicyRule) bool {
	return slices.EqualFunc(a, b, func(x, y *rbacv1.PolicyRule) bool { return proto.Equal(x, y) })
}
