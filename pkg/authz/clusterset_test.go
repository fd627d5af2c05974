package authz_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/fleetstream/fleetstream/pkg/authz"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// A set admin's cluster update is decided on the cluster's sets as the registry shows them, and
// applies only to the cluster as it was decided on: the request is pinned to that revision, so a
// cluster moved out of the set meanwhile is not updated (the registry refuses the stale
// revision). A revision the mirror has not seen yet is not decided on.
func TestSetAdminUpdatesArePinnedToTheRevisionDecidedOn(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 60*time.Second)
	kv := func(bucket string) jetstream.KeyValue {
		b, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	setRoles, sets, clusters := kv(subjects.ClusterSetRolesBucket), kv(subjects.ClusterSetsBucket), kv(subjects.ClustersBucket)
	for _, s := range []*placementv1.ClusterSet{
		{Name: "a"}, {Name: "b"}, {Name: "default"},
		{Name: "global", Selector: &placementv1.ClusterSetSelector{Type: placementv1.SelectorType_SELECTOR_TYPE_LABEL_SELECTOR, LabelSelector: &placementv1.LabelSelector{}}},
	} {
		put(t, sets, keys.Encode(s.Name), s)
	}
	put(t, clusters, keys.Encode("a1"), &clusterv1.Cluster{Name: "a1", Labels: map[string]string{"fleetstream.io/clusterset": "a"}, Revision: 7})
	put(t, setRoles, "r1", &placementv1.ClusterSetRoleBinding{ClusterSet: "a", Role: roles.ClusterSetAdmin,
		Subject: &rbacv1.Subject{Kind: rbacv1.SubjectKind_SUBJECT_KIND_USER, Name: "alice"}})

	az := authz.New(j.JS, authz.Config{PlatformAdmins: []string{"root"}}, testkit.Logger(t))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = az.Run(runCtx) }()
	<-az.Ready()

	labels := func(set string) map[string]string {
		return map[string]string{"fleetstream.io/clusterset": set, "tier": "gold"}
	}
	for _, tc := range []struct {
		name     string
		user     string
		labels   map[string]string
		expected uint64
		want     uint64 // the expected revision the request carries on; 0 with denied
		denied   string
	}{
		{"unconditional: pinned", "alice", labels("a"), 0, 7, ""},
		{"conditional: kept", "alice", labels("a"), 7, 7, ""},
		{"an older revision: left to the registry to refuse", "alice", labels("a"), 5, 5, ""},
		{"a revision not seen yet", "alice", labels("a"), 12, 0, "not yet seen"},
		{"out of its set", "alice", labels("b"), 0, 0, `cluster set "b"`},
		{"a platform admin: not pinned", "root", labels("b"), 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &clusterv1.UpdateClusterRequest{Name: "a1", Labels: tc.labels, ExpectedRevision: tc.expected,
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}}
			_, err := az.Authorize(identity.WithActor(ctx, tc.user), clusterv1connect.ClusterServiceUpdateClusterProcedure, m)
			switch {
			case tc.denied != "":
				if err == nil || !strings.Contains(err.Error(), tc.denied) {
					t.Fatalf("got %v, want a denial naming %q", err, tc.denied)
				}
			case err != nil:
				t.Fatalf("refused: %v", err)
			case m.ExpectedRevision != tc.want:
				t.Fatalf("expected revision %d after authorization, want %d", m.ExpectedRevision, tc.want)
			}
		})
	}
}
