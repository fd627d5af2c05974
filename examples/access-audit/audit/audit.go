// Package audit is an example downstream system: it reads Fleetstream's RBAC and namespace
// events as a subscriber (pkg/subscribe) and appends one JSON line per change of access —
// who was granted or lost which role in which project, and which namespaces a project gained
// or released — so an auditor can answer "who could do what where, and since when" from a file.
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/events"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/subscribe"
)

// Record is one line of the audit log.
type Record struct {
	// EventID is the envelope id: a redelivered event repeats it, so a reader can drop doubles.
	EventID string `json:"event_id"`
	Time    string `json:"time"`
	Actor   string `json:"actor"`
	// Action: "grant", "revoke", "namespace-bound" or "namespace-released".
	Action    string `json:"action"`
	Project   string `json:"project"`
	Subject   string `json:"subject,omitempty"`
	Role      string `json:"role,omitempty"`
	Cluster   string `json:"cluster,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

// Types are the events the log is made of.
var Types = []string{
	"fleetstream.rbac.v1.ProjectRoleBound", "fleetstream.rbac.v1.ProjectRoleUnbound",
	"fleetstream.project.v1.NamespaceBound", "fleetstream.project.v1.NamespaceUnbinding",
}

// Streams are the streams the subscriber needs to have been given.
var Streams = []string{subjects.RBACStream, subjects.NamespaceStream}

// Run appends records to w until ctx ends. cfg names the subscriber; its streams and types
// are set here.
func Run(ctx context.Context, cfg subscribe.Config, w io.Writer, log *zap.Logger) error {
	cfg.Streams, cfg.Types = Streams, Types
	var mu sync.Mutex // the two streams hand over concurrently
	enc := json.NewEncoder(w)
	return subscribe.Run(ctx, cfg, func(_ context.Context, ev *events.Event) error {
		r, ok := record(ev)
		if !ok {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("write audit record: %w", err) // retried: nothing is lost
		}
		return nil
	}, log)
}

func subjectName(s *rbacv1.Subject) string {
	switch s.GetKind() {
	case rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		return "group:" + s.GetName()
	case rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT:
		return "serviceaccount:" + s.GetNamespace() + ":" + s.GetName()
	}
	return "user:" + s.GetName()
}

func record(ev *events.Event) (Record, bool) {
	r := Record{EventID: ev.Id, Time: ev.GetTime().AsTime().UTC().Format("2006-01-02T15:04:05.000Z07:00"), Actor: ev.Actor}
	switch p := ev.Payload.(type) {
	case *rbacv1.ProjectRoleBound:
		r.Action, r.Project, r.Subject, r.Role = "grant", p.Binding.GetProject(), subjectName(p.Binding.GetSubject()), p.Binding.GetRoleTemplate()
	case *rbacv1.ProjectRoleUnbound:
		r.Action, r.Project, r.Subject, r.Role = "revoke", p.Project, subjectName(p.Subject), p.RoleTemplate
	case *projectv1.NamespaceBound:
		r.Action, r.Project, r.Cluster, r.Namespace = "namespace-bound", p.Project, p.Cluster, p.Namespace
	case *projectv1.NamespaceUnbinding:
		r.Action, r.Project, r.Cluster, r.Namespace = "namespace-released", p.Project, p.Cluster, p.Namespace
	default:
		return r, false
	}
	return r, true
}
