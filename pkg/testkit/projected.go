package testkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/view"
)

// WaitProjected waits until the bucket of every projection records a checkpoint at or past the
// last event of its stream that the projection reads: everything appended before the call is
// then in the views. A test asserting that something is absent from a view (or from what is
// derived from it) waits for this first, or the assertion passes before the writer has even
// seen the event. A projection whose bucket does not exist (its service is not running) is
// skipped.
func WaitProjected(t testing.TB, js jetstream.JetStream, ps ...view.Projection) {
	t.Helper()
	ctx := context.Background()
	for _, p := range ps {
		kv, err := js.KeyValue(ctx, p.Bucket.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("view %s: %v", p.Name, err)
		}
		last, err := view.LastRead(ctx, js, p)
		if err != nil {
			t.Fatalf("view %s: %v", p.Name, err)
		}
		Eventually(t, 10*time.Second, func() error {
			cp, err := checkpoint(ctx, kv)
			if err != nil {
				return err
			}
			if cp < last {
				return fmt.Errorf("view %s at checkpoint %d, its last event is %d", p.Name, cp, last)
			}
			return nil
		})
	}
}

// checkpoint reads the checkpoint a view recorded in its bucket (0 before the first).
func checkpoint(ctx context.Context, kv jetstream.KeyValue) (uint64, error) {
	e, err := kv.Get(ctx, view.MetaKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var m struct {
		Checkpoint uint64 `json:"checkpoint"`
	}
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return 0, fmt.Errorf("checkpoint in bucket %s: %w", kv.Bucket(), err)
	}
	return m.Checkpoint, nil
}
