package audit

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

func TestDescribe(t *testing.T) {
	for _, tc := range []struct {
		stream, subject string
		payload         proto.Message
		want            Object
	}{
		{subjects.ClusterStream, "fleet.cluster.prod-1", nil, Object{Kind: "cluster", Name: "prod-1", Cluster: "prod-1"}},
		{subjects.ClusterStream, "fleet.cluster.subscriber.siem", nil, Object{Kind: "subscriber", Name: "siem"}},
		{subjects.ClusterStream, "fleet.cluster.importpolicy.capi", nil, Object{Kind: "importpolicy", Name: "capi"}},
		{subjects.NamespaceStream, "fleet.ns.project.team-a", &projectv1.NamespaceBound{Project: "team-a", Cluster: "c1", Namespace: "web"},
			Object{Kind: "project", Name: "team-a", Project: "team-a", Cluster: "c1"}},
		{subjects.PlacementStream, "fleet.placement.placement.team-a.web", nil, Object{Kind: "placement", Name: "web", Project: "team-a"}},
		{subjects.PlacementStream, "fleet.placement.binding.team-a.eu", nil, Object{Kind: "clustersetbinding", Name: "eu", Project: "team-a"}},
		{subjects.PlacementStream, "fleet.placement.clusterset.eu", nil, Object{Kind: "clusterset", Name: "eu"}},
		{subjects.PlacementStream, "fleet.placement.addonscore.c1.cost.cheap", nil, Object{Kind: "addonscore", Name: "c1/cost/cheap", Cluster: "c1"}},
		{subjects.RBACStream, "fleet.rbac.roletemplate.viewer", nil, Object{Kind: "roletemplate", Name: "viewer"}},
		{subjects.RBACStream, "fleet.rbac.binding.team-a.User.=.alice.project-owner", nil,
			Object{Kind: "rolebinding", Name: "User//alice/project-owner", Project: "team-a"}},
		{subjects.EndpointStream, "fleet.endpoint.weight.shop.cart", nil, Object{Kind: "serviceweight", Name: "shop/cart"}},
		// Encoded tokens are decoded: a name with a dot.
		{subjects.ClusterStream, "fleet.cluster.a=2Eb", nil, Object{Kind: "cluster", Name: "a.b", Cluster: "a.b"}},
	} {
		if got := describe(tc.stream, tc.subject, tc.payload); got != tc.want {
			t.Errorf("describe(%s, %s) = %+v, want %+v", tc.stream, tc.subject, got, tc.want)
		}
	}
}

func TestActivitySubjectIsBounded(t *testing.T) {
	long := strings.Repeat("a.", 700) // 1,400 bytes, 2,100 encoded
	for _, tc := range []struct {
		name string
		a    *auditv1.Activity
		want string
	}{
		{"short", &auditv1.Activity{Project: "team-a", Kind: "project", Name: "team-a", Actor: "alice"}, "fleet.audit.event.team-a.=.project.team-a.alice"},
		{"long name", &auditv1.Activity{Project: "team-a", Kind: "rolebinding", Name: long, Actor: "alice"}, "fleet.audit.event.team-a.=.rolebinding.=.alice"},
		{"long everything", &auditv1.Activity{Project: long, Cluster: long, Kind: "k", Name: long, Actor: long}, "fleet.audit.event.=.=.k.=.="},
	} {
		if got := activitySubject(ClassEvent, tc.a); got != tc.want {
			t.Errorf("%s: %.80s, want %s", tc.name, got, tc.want)
		}
	}
}
