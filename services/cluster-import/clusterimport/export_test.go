package clusterimport

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// What only the tests of this module need: compiled into the test binary alone, so the
// Registry's API stays what production code calls.

// SecretReports is the number of Secret reports the import controller has received since
// the Registry started (for WaitImportPass).
func (s *Registry) SecretReports() uint64 {
	_, n := s.lifecycles.sources.handled()
	return n
}

// WaitImportPass blocks until the import lifecycle controller has made a whole pass that
// began after the call, with the registry and the import policies as they are in their buckets
// now, the agents' reports in FLEET_AGENT up to sequence agentSeq and at least secretReports
// Secret reports (SecretReports): whatever those make it do (register, update, remove a
// cluster, render again) has then been done. It asks for the pass itself, since a pass that
// changes nothing is otherwise not due. Tests use it before asserting that something did not
// happen.
func (s *Registry) WaitImportPass(ctx context.Context, agentSeq, secretReports uint64) error {
	l := s.lifecycles
	for _, current := range []func(context.Context) (uint64, error){s.clusters.Current, s.importPolicies.Current} {
		if _, err := current(ctx); err != nil {
			return err
		}
	}
	// The counters have no change signal: polling paces this wait, which only tests use.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		seq, secrets := l.sources.handled()
		if seq >= agentSeq && secrets >= secretReports {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for import reports (sequence %d, %d secrets; at %d, %d): %w", agentSeq, secretReports, seq, secrets, ctx.Err())
		case <-tick.C:
		}
	}
	l.mu.Lock()
	want := l.started + 1
	l.mu.Unlock()
	l.kick()
	for {
		l.mu.Lock()
		done := l.passes
		l.mu.Unlock()
		if done >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for an import pass: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// LivenessRetries is the liveness controller's fleet_workqueue_retries_total: how many times a
// cluster's check failed and was queued again.
func (s *Registry) LivenessRetries() (float64, error) {
	reg := prometheus.NewRegistry()
	for _, c := range s.livenessController().Collectors() {
		if err := reg.Register(c); err != nil {
			return 0, err
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() == "fleet_workqueue_retries_total" {
			return mf.GetMetric()[0].GetCounter().GetValue(), nil
		}
	}
	return 0, fmt.Errorf("no retries metric")
}

// SyncLiveness returns once every connected cluster has been checked since the call (and
// marked lost if it was due): tests call it before asserting that one was not.
func (s *Registry) SyncLiveness(ctx context.Context) error { return s.livenessController().Sync(ctx) }
