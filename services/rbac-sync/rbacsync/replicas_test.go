package rbacsync_test

import (
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// Two replicas of the hub (cluster-import, namespace-binding, rbac-sync) on one JetStream: the
// second becomes ready while the first holds every lease, answers from the state the first
// writes, and when the first stops it takes over the views and the fan-out.
func TestSecondReplicaFollowsThenTakesOver(t *testing.T) {
	e1 := start(t, nil, rbacsync.Config{})
	e1.register(t, "c1")
	e1.createProject(t, "team-a")
	e1.bindNS(t, "team-a", "c1", "web")
	e1.createTemplate(t, "viewer", nil, rule("", "pods", "get"))

	e2 := start(t, e1.js, rbacsync.Config{}) // waits until every service of e2 is ready
	e2.bindRole(t, "team-a", user("alice"), "viewer")
	e1.waitState(t, rbKey("c1", "web", "viewer"), "subjects:alice")
	// The follower's fan-out keeps the model and follows the bucket: its API sees the entry.
	byTemplate := &rbacv1.GetPropagationStatusRequest{Target: &rbacv1.GetPropagationStatusRequest_RoleTemplate{RoleTemplate: "viewer"}}
	ctx := testkit.Context(t, 60*time.Second)
	for _, e := range []*env{e1, e2} {
		testkit.Eventually(t, 10*time.Second, func() error {
			res, err := e.rbac.GetPropagationStatus(ctx, connect.NewRequest(byTemplate))
			if err != nil {
				return err
			}
			if len(res.Msg.Clusters) != 1 {
				return fmt.Errorf("status %v", res.Msg)
			}
			return nil
		})
	}

	e1.stop() // clean stop: leases are released, e2 takes over at once
	e2.bindRole(t, "team-a", user("bob"), "viewer")
	e2.waitState(t, rbKey("c1", "web", "viewer"), "subjects:alice,bob")
	e2.unbindRole(t, "team-a", user("alice"), "viewer")
	e2.waitState(t, rbKey("c1", "web", "viewer"), "subjects:bob")
}
