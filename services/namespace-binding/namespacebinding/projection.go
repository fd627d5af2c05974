package namespacebinding

import (
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/events"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/namespace-binding/placement"
)

// Stream, subjects and buckets namespace-binding owns (names in pkg/subjects: rbac-sync reads
// the bindings view).
const (
	Stream         = subjects.NamespaceStream
	SubjectPrefix  = subjects.NamespacePrefix
	ProjectsBucket = subjects.ProjectsBucket
	BindingsBucket = subjects.NamespaceBindingsBucket
	ClaimsBucket   = subjects.NamespaceClaimsBucket
)

// FLEET_PLACEMENT is placement's (package placement) but for the namespaces that follow a
// placement, which this service records and follows (follow.go).
const (
	PlacementStream = placement.Stream
	PlacementPrefix = placement.SubjectPrefix
)

// ProjectSubject is where every command on project name and its bindings is appended.
func ProjectSubject(name string) string { return SubjectPrefix + ".project." + keys.Encode(name) }

// bindingSubject is where derived events about one binding are appended.
func bindingSubject(cluster, namespace string) string {
	return SubjectPrefix + ".binding." + keys.Join(cluster, namespace)
}

func projectKey(name string) string { return keys.Encode(name) }

func bindingKey(cluster, namespace string) string { return keys.Join(cluster, namespace) }

func bucketConfig(name, desc string) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: name, Description: desc, History: 1, Storage: jetstream.FileStorage}
}

// projectsProjection folds the project subjects into bucket ns-projects. Every event on a
// project's subject touches its entry, so a project's revision is the last sequence of its
// subject: the expectation every command on the project appends with.
//
// Version 2 folds ProjectBudgetSet into the project's budgets. A replica still running version
// 1 dead-letters that event; the version bump makes the first leader of version 2 rebuild the
// bucket from the stream, so no budget is lost to a rolling upgrade.
func projectsProjection() view.Projection {
	return view.Projection{
		Name:     "ns-projects",
		Version:  2,
		Stream:   Stream,
		Subjects: []string{SubjectPrefix + ".project.>"},
		Bucket:   bucketConfig(ProjectsBucket, "Projects (projection of FLEET_NS)."),
		New:      func() proto.Message { return &projectv1.Project{} },
		Apply:    applyProject,
	}
}

func applyProject(ev *events.Event) ([]view.Change, error) {
	name, err := subjects.NameUnder(ev.Subject, SubjectPrefix+".project.")
	if err != nil {
		return nil, err
	}
	at := ev.GetTime()
	update := func(f func(p *projectv1.Project) *projectv1.Project) []view.Change {
		return []view.Change{view.ChangeOf(projectKey(name), f)}
	}
	switch p := ev.Payload.(type) {
	case *projectv1.ProjectCreated:
		if p.Name != name {
			return nil, fmt.Errorf("ProjectCreated for %q on subject of %q", p.Name, name)
		}
		return update(func(*projectv1.Project) *projectv1.Project {
			return &projectv1.Project{Name: p.Name, DisplayName: p.DisplayName, Labels: p.Labels, CreateTime: at, UpdateTime: at}
		}), nil
	case *projectv1.ProjectDeleted:
		return update(func(*projectv1.Project) *projectv1.Project { return nil }), nil
	case *projectv1.ProjectBudgetSet:
		if p.Project != name {
			return nil, fmt.Errorf("ProjectBudgetSet for %q on subject of %q", p.Project, name)
		}
		return update(func(cur *projectv1.Project) *projectv1.Project {
			if cur == nil {
				return nil
			}
			setBudget(cur, p.Cluster, p.Hard)
			cur.UpdateTime = at
			return cur
		}), nil
	case *projectv1.NamespaceBound, *projectv1.NamespaceQuotaUpdated, *projectv1.NamespaceUnbinding:
		// Only the revision moves; the status is computed from the bindings when read.
		return update(func(cur *projectv1.Project) *projectv1.Project { return cur }), nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
}

// bindingsProjection folds every FLEET_NS subject into bucket ns-bindings. A binding's phase is
// Pending when bound and Terminating when unbound (commands); in between, the transitions the
// agents report are recorded as NamespaceBindingStatusChanged (see runStatus).
//
// Version 2 keeps the placement a binding was made for: a version-1 writer would drop it and
// the follower would take a placement's binding for one made by hand, so an upgrade rebuilds.
func bindingsProjection() view.Projection {
	return view.Projection{
		Name:     "ns-bindings",
		Version:  2,
		Stream:   Stream,
		Subjects: []string{SubjectPrefix + ".>"},
		Bucket:   bucketConfig(BindingsBucket, "Project-namespace bindings (projection of FLEET_NS)."),
		New:      func() proto.Message { return &projectv1.NamespaceBinding{} },
		Apply:    applyBinding,
	}
}

func applyBinding(ev *events.Event) ([]view.Change, error) {
	at := ev.GetTime()
	// same applies f to the current binding when it is the one the event is about; a stale
	// event (the binding was replaced since) changes nothing.
	same := func(id, cluster, namespace string, f func(b *projectv1.NamespaceBinding) *projectv1.NamespaceBinding) []view.Change {
		return []view.Change{view.ChangeOf(bindingKey(cluster, namespace), func(b *projectv1.NamespaceBinding) *projectv1.NamespaceBinding {
			if b == nil || b.Id != id {
				return b
			}
			return f(b)
		})}
	}
	switch p := ev.Payload.(type) {
	case *projectv1.ProjectCreated, *projectv1.ProjectDeleted, *projectv1.ProjectBudgetSet:
		return nil, nil
	case *projectv1.NamespaceBound:
		return []view.Change{{Key: bindingKey(p.Cluster, p.Namespace), Update: func(proto.Message) proto.Message {
			return &projectv1.NamespaceBinding{Id: p.BindingId, Project: p.Project, Cluster: p.Cluster, Namespace: p.Namespace,
				Hard: p.Hard, Placement: p.Placement, Phase: projectv1.BindingPhase_BINDING_PHASE_PENDING, Reason: ReasonWaitingForAgent,
				Message:    fmt.Sprintf("waiting for the agent of cluster %s to apply the namespace", p.Cluster),
				CreateTime: at, UpdateTime: at}
		}}}, nil
	case *projectv1.NamespaceQuotaUpdated:
		return same(p.BindingId, p.Cluster, p.Namespace, func(b *projectv1.NamespaceBinding) *projectv1.NamespaceBinding {
			b.Hard, b.UpdateTime = p.Hard, at
			return b
		}), nil
	case *projectv1.NamespaceUnbinding:
		return same(p.BindingId, p.Cluster, p.Namespace, func(b *projectv1.NamespaceBinding) *projectv1.NamespaceBinding {
			b.Phase, b.UnbindPolicy, b.UpdateTime = projectv1.BindingPhase_BINDING_PHASE_TERMINATING, p.Policy, at
			return b
		}), nil
	case *projectv1.NamespaceBindingStatusChanged:
		return same(p.BindingId, p.Cluster, p.Namespace, func(b *projectv1.NamespaceBinding) *projectv1.NamespaceBinding {
			if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING || p.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
				return b // unbinding is a command, not an observation
			}
			b.Phase, b.Reason, b.Message = p.Phase, p.Reason, p.Message
			return b
		}), nil
	case *projectv1.NamespaceReleased:
		return same(p.BindingId, p.Cluster, p.Namespace, func(b *projectv1.NamespaceBinding) *projectv1.NamespaceBinding {
			if b.Phase != projectv1.BindingPhase_BINDING_PHASE_TERMINATING {
				return b
			}
			return nil
		}), nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
}

// desiredProjection writes each binding's Namespace and ResourceQuota into bucket
// desired-namespaces, under the cluster's keys, which the cluster's agent watches. Being a
// projection, the desired state is rebuilt from the stream like any view, and a cluster whose
// agent connects late (or reconnects) replays its keys. Removal writes tombstones, never
// deletes keys, so an agent that was offline still acts on it when it returns; the release
// (on the binding subjects) then deletes them.
//
// Version must not change lightly: a new version drops and rebuilds the bucket, which every
// agent watches. Version 2 deletes a released binding's tombstones: a release is appended only once the agent
// carried them out (or the cluster was deregistered), so nothing is left for them to say, and
// the agent, seeing the key go, drops its status too. Before, every unbound namespace left its
// tombstones (and statuses) behind for ever.
func desiredProjection() view.Projection {
	return view.Projection{
		Name:     "desired-namespaces",
		Version:  2,
		Stream:   Stream,
		Subjects: []string{SubjectPrefix + ".project.>", SubjectPrefix + ".binding.>"},
		Bucket:   subjects.FeedBucketConfig(subjects.DesiredNamespacesBucket, "Desired Namespaces and ResourceQuotas of member clusters (projection of FLEET_NS)."),
		New:      func() proto.Message { return &desiredv1.DesiredObject{} },
		Apply:    applyDesired,
	}
}

func applyDesired(ev *events.Event) ([]view.Change, error) {
	put := func(key string, obj *desiredv1.DesiredObject) view.Change {
		return view.Change{Key: key, Update: func(proto.Message) proto.Message { return proto.Clone(obj) }}
	}
	switch p := ev.Payload.(type) {
	case *projectv1.ProjectCreated, *projectv1.ProjectDeleted, *projectv1.ProjectBudgetSet:
		return nil, nil
	case *projectv1.NamespaceBound:
		changes := []view.Change{put(namespaceDesiredKey(p.Cluster, p.Namespace), namespaceObject(p.Project, p.Namespace))}
		if len(p.Hard) > 0 {
			changes = append(changes, put(quotaDesiredKey(p.Cluster, p.Namespace), quotaObject(p.Project, p.Namespace, p.Hard)))
		}
		return changes, nil
	case *projectv1.NamespaceQuotaUpdated:
		obj := quotaObject(p.Project, p.Namespace, p.Hard)
		if len(p.Hard) == 0 {
			obj = tombstone(p.Project, desiredv1.DeletionPolicy_DELETION_POLICY_DELETE)
		}
		return []view.Change{put(quotaDesiredKey(p.Cluster, p.Namespace), obj)}, nil
	case *projectv1.NamespaceUnbinding:
		changes := []view.Change{put(namespaceDesiredKey(p.Cluster, p.Namespace), tombstone(p.Project, deletionPolicy(p.Policy)))}
		if p.DeleteQuota {
			changes = append(changes, put(quotaDesiredKey(p.Cluster, p.Namespace), tombstone(p.Project, desiredv1.DeletionPolicy_DELETION_POLICY_DELETE)))
		}
		return changes, nil
	case *projectv1.NamespaceReleased:
		// Only tombstones go: the same project may have bound the namespace again while it was
		// Terminating, and its new objects stay.
		gc := func(key string) view.Change {
			return view.Change{Key: key, Update: func(cur proto.Message) proto.Message {
				if o, ok := cur.(*desiredv1.DesiredObject); ok && o != nil && !o.Tombstone {
					return o
				}
				return nil
			}}
		}
		return []view.Change{gc(namespaceDesiredKey(p.Cluster, p.Namespace)), gc(quotaDesiredKey(p.Cluster, p.Namespace))}, nil
	case *projectv1.NamespaceBindingStatusChanged:
		return nil, nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
}
