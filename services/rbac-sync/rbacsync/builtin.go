package rbacsync

import (
	"context"
	"fmt"
	"slices"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/roles"
)

// ensureBuiltins creates the built-in project roles, or brings them to this version's rules,
// through the same events an admin's change would append. Replicas starting together race on
// the subject's last sequence; the loser sees the winner's template and has nothing to do.
// Their rules are those of this binary: after an upgrade the new rules take effect at once.
func (s *Service) ensureBuiltins(ctx context.Context) error {
	// Parents first, so an inherited template always exists when its heir is written.
	for _, want := range roles.Builtin() {
		for attempt := 0; ; attempt++ {
			err := s.ensureBuiltin(ctx, want)
			if err == nil {
				break
			}
			if !events.IsConflict(err) || attempt >= 5 {
				return fmt.Errorf("built-in role template %s: %w", want.Name, err)
			}
		}
	}
	return nil
}

func (s *Service) ensureBuiltin(ctx context.Context, want *rbacv1.RoleTemplate) error {
	subject := TemplateSubject(want.Name)
	cur, ok := s.lookup(want.Name)
	var seq uint64
	var err error
	switch {
	case !ok:
		last, lerr := events.LastSequence(ctx, s.stream, subject)
		if lerr != nil {
			return lerr
		}
		seq, err = s.store.Append(ctx, subject, want.Name, events.At(last), &rbacv1.RoleTemplateCreated{Template: want})
	case cur.DisplayName != want.DisplayName || cur.Locked || !slices.Equal(cur.Inherits, want.Inherits) || !rulesEqual(cur.Rules, want.Rules):
		next := stored(cur)
		next.DisplayName, next.Rules, next.Inherits, next.Locked = want.DisplayName, want.Rules, want.Inherits, false
		seq, err = s.store.Append(ctx, subject, want.Name, events.At(cur.Revision),
			&rbacv1.RoleTemplateUpdated{Template: next, Fields: []string{"display_name", "rules", "inherits", "locked"}})
	default:
		return nil
	}
	if err != nil {
		if events.IsConflict(err) {
			// Another replica wrote it: wait until this one's view shows a newer revision.
			var rev uint64
			if ok {
				rev = cur.Revision
			}
			_ = s.templates.WaitFor(ctx, templateKey(want.Name), func(t *rbacv1.RoleTemplate, ok bool) bool { return ok && t.Revision > rev })
		}
		return err
	}
	if err := s.templates.WaitRevision(ctx, templateKey(want.Name), seq, false); err != nil {
		return err
	}
	s.log.Info("built-in role template written", zap.String("template", want.Name))
	return nil
}

func rulesEqual(a, b []*rbacv1.PolicyRule) bool {
	return slices.EqualFunc(a, b, func(x, y *rbacv1.PolicyRule) bool { return proto.Equal(x, y) })
}
