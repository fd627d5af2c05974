package namespacebinding

import (
	"context"
	"fmt"
)

// What only the tests of this module need: compiled into the test binary alone, so the
// Service's API stays what production code calls.

// WaitSchedulingRound blocks until the placement scheduler has made a whole round that began
// after the call, with the clusters, sets, set bindings, placements, decisions and add-on scores
// as they are in their buckets now: whatever those inputs make it decide has then been
// appended. It asks for the round itself, since a round that changes nothing is otherwise not
// due. Tests use it before asserting that a decision did not change; only the replica holding
// PlacementLease schedules, so on another one it waits until ctx is done.
func (s *Service) WaitSchedulingRound(ctx context.Context) error {
	for _, current := range []func(context.Context) (uint64, error){s.clusters.Current, s.clusterSets.Current,
		s.setBindings.Current, s.placements.Current, s.decisions.Current, s.addOnScores.Current} {
		if _, err := current(ctx); err != nil {
			return err
		}
	}
	want := s.rounds.next()
	s.kickScheduler()
	if err := s.rounds.wait(ctx, want); err != nil {
		return fmt.Errorf("wait for a scheduling round: %w", err)
	}
	return nil
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
