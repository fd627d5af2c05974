package audit

import (
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Object is what an activity row is about.
type Object struct {
	Kind, Name, Project, Cluster string
}

// describe names the object of an event from its subject, which is its aggregate's identity
// (docs/events.md lists every subject), and fills project and cluster from the payload's
// top-level `project` and `cluster` fields where the subject has none (a namespace binding's
// project, a cluster's name in a binding event).
func describe(stream, subject string, payload proto.Message) Object {
	toks := strings.Split(subject, ".")
	if len(toks) < 3 {
		return fromPayload(Object{Kind: stream}, payload)
	}
	rest := make([]string, 0, len(toks)-2)
	for _, t := range toks[2:] {
		if d, err := keys.Decode(t); err == nil {
			t = d
		}
		rest = append(rest, t)
	}
	tail := func(from int) string {
		if from >= len(rest) {
			return ""
		}
		return strings.Join(rest[from:], "/")
	}
	var o Object
	switch stream {
	case subjects.ClusterStream:
		if len(rest) == 1 {
			o = Object{Kind: "cluster", Name: rest[0], Cluster: rest[0]}
		} else {
			o = Object{Kind: rest[0], Name: tail(1)}
		}
	case subjects.NamespaceStream:
		switch rest[0] {
		case "project":
			o = Object{Kind: "project", Name: tail(1), Project: tail(1)}
		case "binding":
			o = Object{Kind: "namespacebinding", Name: tail(2)}
			if len(rest) > 1 {
				o.Cluster = rest[1]
			}
		default:
			o = Object{Kind: rest[0], Name: tail(1)}
		}
	case subjects.PlacementStream:
		kinds := map[string]string{"placement": "placement", "decision": "placementdecision",
			"namespace": "placementnamespace", "binding": "clustersetbinding"}
		if k, ok := kinds[rest[0]]; ok && len(rest) >= 3 {
			o = Object{Kind: k, Project: rest[1], Name: tail(2)}
			break
		}
		switch rest[0] {
		case "setrole":
			o = Object{Kind: "clustersetrole", Name: tail(1)}
		case "addonscore":
			o = Object{Kind: "addonscore", Name: tail(1)}
			if len(rest) > 1 {
				o.Cluster = rest[1]
			}
		default:
			o = Object{Kind: rest[0], Name: tail(1)}
		}
	case subjects.RBACStream:
		switch rest[0] {
		case "binding":
			o = Object{Kind: "rolebinding", Name: tail(2)}
			if len(rest) > 1 {
				o.Project = rest[1]
			}
		default:
			o = Object{Kind: rest[0], Name: tail(1)}
		}
	case subjects.EndpointStream:
		if rest[0] == "weight" {
			o = Object{Kind: "serviceweight", Name: tail(1)}
		} else {
			o = Object{Kind: rest[0], Name: tail(1)}
		}
	default:
		o = Object{Kind: rest[0], Name: tail(1)}
	}
	return fromPayload(o, payload)
}

func fromPayload(o Object, payload proto.Message) Object {
	if payload == nil {
		return o
	}
	m := payload.ProtoReflect()
	str := func(name protoreflect.Name) string {
		f := m.Descriptor().Fields().ByName(name)
		if f == nil || f.Kind() != protoreflect.StringKind || f.IsList() || f.IsMap() {
			return ""
		}
		return m.Get(f).String()
	}
	if o.Project == "" {
		o.Project = str("project")
	}
	if o.Cluster == "" {
		o.Cluster = str("cluster")
	}
	return o
}

// maxSubjectBytes bounds an activity record's subject well below NATS's control line (4 KiB by
// default, subject included): a longer publish would close the connection the service's API and
// indexer share.
const maxSubjectBytes = 2048

// activitySubject is the subject of a record: subjects.AuditActivity, leaving out (matching only
// queries that do not filter on them) the name, then the cluster, the actor and the project,
// while it is too long. The record itself keeps every value.
func activitySubject(class string, a *auditv1.Activity) string {
	project, cluster, name, actor := a.Project, a.Cluster, a.Name, a.Actor
	subject := subjects.AuditActivity(class, project, cluster, a.Kind, name, actor)
	for _, drop := range []*string{&name, &cluster, &actor, &project} {
		if len(subject) <= maxSubjectBytes {
			break
		}
		*drop = ""
		subject = subjects.AuditActivity(class, project, cluster, a.Kind, name, actor)
	}
	return subject
}
