package rbacsync_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// A revoked RoleBinding's tombstone stays until the cluster's agent reports the object absent
// for that tombstone (or a later one), then leaves the bucket; a status about an older revision
// collects nothing, and a key granted again is never collected. The delete marker the collection
// leaves is purged once it is older than MarkerPurgeAfter, so no message is left for the key.
func TestConfirmedTombstonesAreCollected(t *testing.T) {
	e := start(t, nil, rbacsync.Config{CollectInterval: 100 * time.Millisecond, MarkerPurgeAfter: 4 * time.Second})
	ctx := context.Background()
	applied, err := e.js.JS.KeyValue(ctx, subjects.AppliedBucket)
	if err != nil {
		t.Fatal(err)
	}
	report := func(key string, rev uint64, absent bool) {
		t.Helper()
		data, _ := proto.Marshal(&desiredv1.AppliedStatus{DesiredRevision: rev, Phase: desiredv1.Phase_PHASE_APPLIED, Absent: absent})
		if _, err := applied.Put(ctx, subjects.AppliedKey(subjects.DesiredRBACBucket, key), data); err != nil {
			t.Fatal(err)
		}
	}
	e.register(t, "c1")
	e.createProject(t, "p1")
	e.createTemplate(t, "dev", nil, rule("", "pods", "get"))
	e.bindNS(t, "p1", "c1", "web", "api")
	rbWeb, rbAPI := rbKey("c1", "web", "dev"), rbKey("c1", "api", "dev")
	e.bindRole(t, "p1", user("alice"), "dev")
	e.waitState(t, rbWeb, "subjects:alice")
	report(rbWeb, e.get(t, rbWeb).revision, false) // the agent applied the RoleBinding

	e.unbindRole(t, "p1", user("alice"), "dev")
	e.waitState(t, rbWeb, "tombstone")
	e.waitState(t, rbAPI, "tombstone")
	tomb := e.get(t, rbWeb).revision
	// api's status is about an older revision; web's confirms its tombstone and is written
	// after it, so the round that collects web has seen api's too.
	report(rbAPI, e.get(t, rbAPI).revision-1, true)
	report(rbWeb, tomb, true)
	// rbWeb held a tombstone a moment ago, so its going is the collection itself, not a write
	// yet to come.
	testkit.Eventually(t, 10*time.Second, func() error {
		if en := e.get(t, rbWeb); en.present {
			return fmt.Errorf("tombstone of %s not collected yet", rbWeb)
		}
		return nil
	})
	if en := e.get(t, rbAPI); !en.present || !en.obj.Tombstone {
		t.Fatalf("tombstone of %s collected on a status about an older revision: %+v", rbAPI, en)
	}
	stream, err := e.js.JS.Stream(ctx, "KV_"+subjects.DesiredRBACBucket)
	if err != nil {
		t.Fatal(err)
	}
	lastOf := func(key string) (*jetstream.RawStreamMsg, error) {
		return stream.GetLastMsgForSubject(ctx, "$KV."+subjects.DesiredRBACBucket+"."+key)
	}
	if m, err := lastOf(rbWeb); err != nil || m.Header.Get("KV-Operation") != "DEL" {
		t.Fatalf("right after the collection, %s should end in a delete marker: %v, %v", rbWeb, m, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := lastOf(rbWeb)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the delete marker of collected %s was not purged within 20 s (last error %v)", rbWeb, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the stream: nothing to wait on
	}
	if m, err := lastOf(rbAPI); err != nil || m.Header.Get("KV-Operation") != "" {
		t.Fatalf("the uncollected tombstone of %s must stay a value: %v, %v", rbAPI, m, err)
	}

	// Granted again: a fresh object, whatever the old status said.
	e.bindRole(t, "p1", user("bob"), "dev")
	e.waitState(t, rbWeb, "subjects:bob")
	e.waitState(t, rbAPI, "subjects:bob")
}
