package desired

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

func TestParseDesiredKey(t *testing.T) {
	rbac := "rbac.authorization.k8s.io"
	tests := []struct {
		key     string
		want    keyTarget
		wantErr bool
	}{
		{key: subjects.DesiredKey("c.1", "Namespace", "", "team-a"), want: keyTarget{kind: schema.GroupKind{Kind: "Namespace"}, name: "team-a"}},
		{key: subjects.DesiredKey("c1", "ResourceQuota", "team.a", "q"), want: keyTarget{kind: schema.GroupKind{Kind: "ResourceQuota"}, namespace: "team.a", name: "q"}},
		{key: subjects.DesiredKey("c1", "ClusterRole", "", "fleet:view"), want: keyTarget{kind: schema.GroupKind{Group: rbac, Kind: "ClusterRole"}, name: "fleet:view"}},
		{key: subjects.DesiredKey("c1", "rolebinding", "ns", "rb"), want: keyTarget{kind: schema.GroupKind{Group: rbac, Kind: "RoleBinding"}, namespace: "ns", name: "rb"}},
		{key: subjects.DesiredKey("c1", "Widget.example.com", "ns", "w"), want: keyTarget{kind: schema.GroupKind{Group: "example.com", Kind: "Widget"}, namespace: "ns", name: "w"}},
		{key: "c1.Namespace.=", wantErr: true},
		{key: "c1.Namespace.=.=", wantErr: true},
		{key: "c1.Namespace.=.bad=Z", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			got, err := parseDesiredKey(tc.key)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err == nil && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// A replay after a reconnect drops the keys deleted meanwhile.
func TestStoreReplayDropsUnseenKeys(t *testing.T) {
	s := newStore()
	obj := &desiredv1.DesiredObject{}
	s.beginReplay("b")
	s.put(entry{bucket: "b", key: "c.1", obj: obj})
	s.put(entry{bucket: "b", key: "c.2", obj: obj})
	s.put(entry{bucket: "other", key: "c.9", obj: obj})
	if s.isSynced("b") {
		t.Fatal("synced before the replay ended")
	}
	if gone := s.endReplay("b"); len(gone) != 0 {
		t.Fatalf("first replay dropped %v", gone)
	}
	s.beginReplay("b")
	s.put(entry{bucket: "b", key: "c.2", obj: obj})
	gone := s.endReplay("b")
	if !slices.Equal(gone, []string{"b/c.1"}) {
		t.Fatalf("second replay dropped %v, want [b/c.1]", gone)
	}
	if s.has("b/c.1") || !s.has("b/c.2") || !s.has("other/c.9") || !s.isSynced("b") {
		t.Errorf("store after replay: %v synced %v", s.entries, s.synced)
	}
}

func TestSameStatusIgnoresTime(t *testing.T) {
	a := &desiredv1.AppliedStatus{DesiredRevision: 3, Phase: desiredv1.Phase_PHASE_APPLIED, Reason: ReasonApplied, StatusJson: []byte(`{"used":{}}`)}
	b := &desiredv1.AppliedStatus{DesiredRevision: 3, Phase: desiredv1.Phase_PHASE_APPLIED, Reason: ReasonApplied, StatusJson: []byte(`{"used":{}}`), Revision: 9}
	if !sameStatus(a, b) {
		t.Error("statuses differing only in revision/time are different")
	}
	b.StatusJson = []byte(`{"used":{"pods":"1"}}`)
	if sameStatus(a, b) {
		t.Error("a changed status_json is the same")
	}
	if sameStatus(nil, a) || !sameStatus(nil, nil) {
		t.Error("nil handling")
	}
}
