package placement

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// The views of placement, all folded from FLEET_PLACEMENT (docs/placement.md), one aggregate
// per subject:
//   - cluster sets on fleet.placement.clusterset.<set>, set bindings on
//     fleet.placement.binding.<project>.<set>;
//   - set role bindings on fleet.placement.setrole.<set>.<kind>.<name>.<role>, folded into
//     bucket placement-clusterset-roles under the same key: pkg/authz reads that view to
//     decide what a set's admins and viewers may do, placement only records the bindings;
//   - placements on fleet.placement.placement.<project>.<name>, the scheduler's decisions on
//     fleet.placement.decision.<project>.<name>, add-on scores on
//     fleet.placement.addonscore.<cluster>.<resource>.<score>.
//
// The namespaces that follow a placement (fleet.placement.namespace.>) are namespace-binding's:
// its follower keeps their bindings.
const (
	Stream                   = subjects.PlacementStream
	SubjectPrefix            = subjects.PlacementPrefix
	ClusterSetsBucket        = subjects.ClusterSetsBucket
	ClusterSetBindingsBucket = subjects.ClusterSetBindingsBucket
	ClusterSetRolesBucket    = subjects.ClusterSetRolesBucket
)

const setRolePrefix = SubjectPrefix + ".setrole."

// Projections are placement's views, in the order namespace-binding lists them.
func Projections() []view.Projection { return new(Service).declareViews(nil, nil).Projections() }

func bucketConfig(name, desc string) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: name, Description: desc, History: 1, Storage: jetstream.FileStorage}
}

// Index terms of the caches.
func byProject(p string) string { return "p\x00" + p }

func clusterSetKey(name string) string { return keys.Encode(name) }

func setBindingKey(project, set string) string { return keys.Join(project, set) }

func setBindingIndex(_ string, b *placementv1.ClusterSetBinding) []string {
	return []string{byProject(b.Project)}
}

// clusterSetsProjection folds the set subjects into bucket placement-clustersets. Every event
// on a set's subject touches its entry, so its revision is the subject's last sequence.
func clusterSetsProjection() view.Projection {
	return view.Projection{
		Name:     "placement-clustersets",
		Version:  1,
		Stream:   Stream,
		Subjects: []string{SubjectPrefix + ".clusterset.>"},
		Bucket:   bucketConfig(ClusterSetsBucket, "Cluster sets (projection of FLEET_PLACEMENT)."),
		New:      func() proto.Message { return &placementv1.ClusterSet{} },
		Apply:    applyClusterSet,
	}
}

func applyClusterSet(ev *events.Event) ([]view.Change, error) {
	name, err := subjects.NameUnder(ev.Subject, SubjectPrefix+".clusterset.")
	if err != nil {
		return nil, err
	}
	at := ev.GetTime()
	update := func(f func(cur *placementv1.ClusterSet) *placementv1.ClusterSet) []view.Change {
		return []view.Change{view.ChangeOf(clusterSetKey(name), f)}
	}
	switch p := ev.Payload.(type) {
	case *placementv1.ClusterSetCreated:
		if p.GetClusterSet().GetName() != name {
			return nil, fmt.Errorf("ClusterSetCreated for %q on subject of %q", p.GetClusterSet().GetName(), name)
		}
		return update(func(*placementv1.ClusterSet) *placementv1.ClusterSet {
			return &placementv1.ClusterSet{Name: name, Selector: p.ClusterSet.Selector, CreateTime: at, UpdateTime: at}
		}), nil
	case *placementv1.ClusterSetUpdated:
		if p.GetClusterSet().GetName() != name {
			return nil, fmt.Errorf("ClusterSetUpdated for %q on subject of %q", p.GetClusterSet().GetName(), name)
		}
		return update(func(cur *placementv1.ClusterSet) *placementv1.ClusterSet {
			if cur == nil {
				return nil
			}
			cur.Selector, cur.UpdateTime = p.ClusterSet.Selector, at
			return cur
		}), nil
	case *placementv1.ClusterSetDeleted:
		return update(func(*placementv1.ClusterSet) *placementv1.ClusterSet { return nil }), nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
}

// setBindingsProjection folds the binding subjects into bucket placement-clusterset-bindings,
// key <project>.<set> as in the subject.
func setBindingsProjection() view.Projection {
	return view.Projection{
		Name:     "placement-clusterset-bindings",
		Version:  1,
		Stream:   Stream,
		Subjects: []string{SubjectPrefix + ".binding.>"},
		Bucket:   bucketConfig(ClusterSetBindingsBucket, "Cluster set bindings (projection of FLEET_PLACEMENT)."),
		New:      func() proto.Message { return &placementv1.ClusterSetBinding{} },
		Apply:    applySetBinding,
	}
}

func applySetBinding(ev *events.Event) ([]view.Change, error) {
	tok, ok := strings.CutPrefix(ev.Subject, SubjectPrefix+".binding.")
	if !ok {
		return nil, fmt.Errorf("subject %s is not a set binding's", ev.Subject)
	}
	parts, err := keys.Split(tok)
	if err != nil || len(parts) != 2 {
		return nil, fmt.Errorf("subject %s is not a set binding's: %v", ev.Subject, err)
	}
	project, set := parts[0], parts[1]
	change := func(next *placementv1.ClusterSetBinding) []view.Change {
		return []view.Change{{Key: setBindingKey(project, set), Update: func(proto.Message) proto.Message {
			if next == nil {
				return nil
			}
			return proto.Clone(next)
		}}}
	}
	switch p := ev.Payload.(type) {
	case *placementv1.ClusterSetBound:
		if p.Project != project || p.ClusterSet != set {
			return nil, fmt.Errorf("ClusterSetBound for %s/%s on subject of %s/%s", p.Project, p.ClusterSet, project, set)
		}
		return change(&placementv1.ClusterSetBinding{Project: project, ClusterSet: set, CreateTime: ev.GetTime()}), nil
	case *placementv1.ClusterSetUnbound:
		return change(nil), nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
}

func bySet(set string) string { return "s\x00" + set }

func setRoleIndex(_ string, b *placementv1.ClusterSetRoleBinding) []string {
	return []string{bySet(b.ClusterSet)}
}

// setRolesProjection folds the set role subjects into bucket placement-clusterset-roles.
func setRolesProjection() view.Projection {
	return view.Projection{
		Name:     ClusterSetRolesBucket,
		Version:  1,
		Stream:   Stream,
		Subjects: []string{setRolePrefix + ">"},
		Bucket:   bucketConfig(ClusterSetRolesBucket, "Cluster set role bindings (projection of FLEET_PLACEMENT)."),
		New:      func() proto.Message { return &placementv1.ClusterSetRoleBinding{} },
		Apply:    applySetRole,
	}
}

func applySetRole(ev *events.Event) ([]view.Change, error) {
	key, ok := strings.CutPrefix(ev.Subject, setRolePrefix)
	if !ok {
		return nil, fmt.Errorf("subject %s is not a set role binding's", ev.Subject)
	}
	if parts, err := keys.Split(key); err != nil || len(parts) != 4 {
		return nil, fmt.Errorf("subject %s is not a set role binding's: %v", ev.Subject, err)
	}
	switch p := ev.Payload.(type) {
	case *placementv1.ClusterSetRoleBound:
		b := p.GetBinding()
		if k := setRoleKey(b.GetClusterSet(), b.GetSubject(), b.GetRole()); k != key {
			return nil, fmt.Errorf("ClusterSetRoleBound of %s on subject %s", k, ev.Subject)
		}
		return []view.Change{{Key: key, Update: func(proto.Message) proto.Message {
			return &placementv1.ClusterSetRoleBinding{ClusterSet: b.ClusterSet, Subject: b.Subject, Role: b.Role,
				CreateTime: ev.GetTime(), Creator: ev.GetActor()}
		}}}, nil
	case *placementv1.ClusterSetRoleUnbound:
		return []view.Change{{Key: key, Update: func(proto.Message) proto.Message { return nil }}}, nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.GetType(), ev.Subject)
}

func placementKey(project, name string) string { return keys.Join(project, name) }

func placementIndex(_ string, p *placementv1.Placement) []string {
	return []string{byProject(p.Project)}
}

// twoTokens splits the <a>.<b> tail of subject after prefix.
func twoTokens(subject, prefix string) (string, string, error) {
	tok, ok := strings.CutPrefix(subject, prefix)
	if !ok {
		return "", "", fmt.Errorf("subject %s is not under %s", subject, prefix)
	}
	parts, err := keys.Split(tok)
	if err != nil || len(parts) != 2 {
		return "", "", fmt.Errorf("subject %s: want two tokens after %s: %v", subject, prefix, err)
	}
	return parts[0], parts[1], nil
}

func placementsProjection() view.Projection {
	return view.Projection{
		Name:     "placement-placements",
		Version:  1,
		Stream:   Stream,
		Subjects: []string{SubjectPrefix + ".placement.>"},
		Bucket:   bucketConfig(subjects.PlacementsBucket, "Placements (projection of FLEET_PLACEMENT)."),
		New:      func() proto.Message { return &placementv1.Placement{} },
		Apply:    applyPlacement,
	}
}

func applyPlacement(ev *events.Event) ([]view.Change, error) {
	project, name, err := twoTokens(ev.Subject, SubjectPrefix+".placement.")
	if err != nil {
		return nil, err
	}
	at := ev.GetTime()
	change := func(f func(cur *placementv1.Placement) *placementv1.Placement) []view.Change {
		return []view.Change{view.ChangeOf(placementKey(project, name), f)}
	}
	check := func(p *placementv1.Placement) error {
		if p.GetProject() != project || p.GetName() != name {
			return fmt.Errorf("%s for %s/%s on subject of %s/%s", ev.Type, p.GetProject(), p.GetName(), project, name)
		}
		return nil
	}
	switch p := ev.Payload.(type) {
	case *placementv1.PlacementCreated:
		if err := check(p.Placement); err != nil {
			return nil, err
		}
		return change(func(*placementv1.Placement) *placementv1.Placement {
			out := placementSpec(p.Placement)
			out.CreateTime, out.UpdateTime = at, at
			return out
		}), nil
	case *placementv1.PlacementUpdated:
		if err := check(p.Placement); err != nil {
			return nil, err
		}
		return change(func(cur *placementv1.Placement) *placementv1.Placement {
			if cur == nil {
				return nil
			}
			out := placementSpec(p.Placement)
			out.CreateTime, out.UpdateTime = cur.CreateTime, at
			return out
		}), nil
	case *placementv1.PlacementDeleted:
		return change(func(*placementv1.Placement) *placementv1.Placement { return nil }), nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
}

func decisionsProjection() view.Projection {
	return view.Projection{
		Name:     "placement-decisions",
		Version:  1,
		Stream:   Stream,
		Subjects: []string{SubjectPrefix + ".decision.>"},
		Bucket:   bucketConfig(subjects.PlacementDecisionsBucket, "Placement decisions (projection of FLEET_PLACEMENT)."),
		New:      func() proto.Message { return &placementv1.PlacementDecisions{} },
		Apply:    applyDecisions,
	}
}

func applyDecisions(ev *events.Event) ([]view.Change, error) {
	project, name, err := twoTokens(ev.Subject, SubjectPrefix+".decision.")
	if err != nil {
		return nil, err
	}
	p, ok := ev.Payload.(*placementv1.PlacementDecisionsChanged)
	if !ok {
		return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
	}
	if p.Project != project || p.Name != name {
		return nil, fmt.Errorf("PlacementDecisionsChanged for %s/%s on subject of %s/%s", p.Project, p.Name, project, name)
	}
	return []view.Change{{Key: placementKey(project, name), Update: func(proto.Message) proto.Message {
		if p.Decisions == nil {
			return nil // the placement was deleted
		}
		return proto.CloneOf(p.Decisions)
	}}}, nil
}

func scoreKey(cluster, resourceName, scoreName string) string {
	return keys.Join(cluster, resourceName, scoreName)
}

func addOnScoresProjection() view.Projection {
	return view.Projection{
		Name:     "placement-addon-scores",
		Version:  1,
		Stream:   Stream,
		Subjects: []string{SubjectPrefix + ".addonscore.>"},
		Bucket:   bucketConfig(subjects.AddOnScoresBucket, "Add-on placement scores (projection of FLEET_PLACEMENT)."),
		New:      func() proto.Message { return &placementv1.AddOnScore{} },
		Apply:    applyAddOnScore,
	}
}

func applyAddOnScore(ev *events.Event) ([]view.Change, error) {
	p, ok := ev.Payload.(*placementv1.AddOnScoreSet)
	if !ok {
		return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
	}
	sc := p.GetScore()
	if want := subjects.AddOnScore(sc.GetCluster(), sc.GetResourceName(), sc.GetScoreName()); want != ev.Subject {
		return nil, fmt.Errorf("AddOnScoreSet for %s on subject %s", want, ev.Subject)
	}
	at := ev.GetTime()
	return []view.Change{{Key: scoreKey(sc.Cluster, sc.ResourceName, sc.ScoreName), Update: func(proto.Message) proto.Message {
		out := proto.CloneOf(sc)
		out.UpdateTime = at
		return out
	}}}, nil
}
