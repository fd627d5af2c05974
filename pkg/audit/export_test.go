package audit

import "github.com/prometheus/client_golang/prometheus"

// SetMaxScan lowers how many index rows one ListActivity call reads, so a test can show the
// bound with a small store.
func (s *Service) SetMaxScan(n uint64) { s.maxScan.Store(n) }

// Dropped returns the dropped-denials counter of reason.
func Dropped(r *DenialRecorder, reason string) prometheus.Counter {
	return r.dropped.WithLabelValues(reason)
}
