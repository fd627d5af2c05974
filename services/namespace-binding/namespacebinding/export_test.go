package namespacebinding

import (
	"context"
	"fmt"
)

// What only the tests of this module need: compiled into the test binary alone, so the
// Service's API stays what production code calls.

// WaitSchedulingRound blocks until the placement scheduler has looked at the fleet and every
// placement since the call, with its inputs as they are in their buckets now (placement's
// WaitSchedulingRound, the scheduler controller's Sync). Only the replica holding
// PlacementLease schedules, so on another one it waits until ctx is done.
func (s *Service) WaitSchedulingRound(ctx context.Context) error {
	return s.placement.WaitSchedulingRound(ctx)
}

// WaitReleasePass blocks until the releaser has looked at every binding it may release, with
// the registry and the desired state as they are in their buckets now and the agents' reports
// up to revision appliedRev of bucket applied: whatever that state releases has then been
// appended. Tests use it before asserting that a binding was not released.
func (s *Service) WaitReleasePass(ctx context.Context, appliedRev uint64) error {
	for _, current := range []func(context.Context) (uint64, error){s.clusters.Current, s.desired.Current, s.bindings.Current} {
		if _, err := current(ctx); err != nil {
			return err
		}
	}
	if err := s.applied.WaitSeen(ctx, appliedRev); err != nil {
		return err
	}
	if err := s.release.Sync(ctx); err != nil {
		return fmt.Errorf("wait for the releaser: %w", err)
	}
	return nil
}
