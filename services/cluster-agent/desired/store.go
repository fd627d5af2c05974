package desired

import (
	"strings"
	"sync"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
)

// sweepKey is the queue item that asks for a prune pass over one bucket. '*' cannot occur in a
// KV key, so it never collides with a desired key.
const sweepKey = "*"

// queueKey is the work item and annotation value of a desired entry: `<bucket>/<key>`.
func queueKey(bucket, key string) string { return bucket + "/" + key }

// splitQueueKey reverses queueKey; bucket names and KV keys hold no '/'.
func splitQueueKey(qk string) (bucket, key string, ok bool) {
	return strings.Cut(qk, "/")
}

// entry is the latest state of one desired key as the watch delivered it.
type entry struct {
	bucket   string
	key      string
	revision uint64
	obj      *desiredv1.DesiredObject
	// decodeErr is set when the value is not a DesiredObject: the key still counts as present
	// (its object is not pruned) but is reported as failed.
	decodeErr error
}

// store holds the desired state of this cluster as replayed and streamed by the bucket watches.
type store struct {
	mu      sync.RWMutex
	entries map[string]entry
	// synced marks buckets whose first full replay completed: only then may an absent key
	// mean "no longer desired".
	synced map[string]bool
	// seen collects the keys of a bucket delivered during a replay in progress, so that keys
	// deleted while the watch was down are dropped when the replay ends.
	seen map[string]map[string]bool
}

func newStore() *store {
	return &store{entries: map[string]entry{}, synced: map[string]bool{}, seen: map[string]map[string]bool{}}
}

func (s *store) get(qk string) (entry, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.entries[qk]
	return e, ok
}

func (s *store) has(qk string) bool {
	_, ok := s.get(qk)
	return ok
}

func (s *store) put(e entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	qk := queueKey(e.bucket, e.key)
	s.entries[qk] = e
	if seen := s.seen[e.bucket]; seen != nil {
		seen[qk] = true
	}
}

func (s *store) remove(qk string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.entries, qk)
}

// beginReplay starts tracking which keys of bucket a new watch delivers.
func (s *store) beginReplay(bucket string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[bucket] = map[string]bool{}
}

// endReplay marks bucket synced and drops its keys the replay did not deliver (deleted while
// the previous watch was down); it returns them so they are reconciled as no longer desired.
func (s *store) endReplay(bucket string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := s.seen[bucket]
	delete(s.seen, bucket)
	var gone []string
	for qk, e := range s.entries {
		if e.bucket == bucket && !seen[qk] {
			delete(s.entries, qk)
			gone = append(gone, qk)
		}
	}
	s.synced[bucket] = true
	return gone
}

func (s *store) isSynced(bucket string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.synced[bucket]
}

// list returns the entries of bucket, or of every bucket when bucket is "".
func (s *store) list(bucket string) []entry {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]entry, 0, len(s.entries))
	for _, e := range s.entries {
		if bucket == "" || e.bucket == bucket {
			out = append(out, e)
		}
	}
	return out
}

func (s *store) syncedBuckets() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for b, ok := range s.synced {
		if ok {
			out = append(out, b)
		}
	}
	return out
}
