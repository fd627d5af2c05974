package namespacebinding

import (
	"context"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/authz"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// watchCoalesce is how long a watch gathers changes before recomputing the projects they
// touch: a burst of agent reports becomes one update per project.
const watchCoalesce = 50 * time.Millisecond

func (s *ProjectAPI) WatchProjects(ctx context.Context, req *connect.Request[projectv1.WatchProjectsRequest], stream *connect.ServerStream[projectv1.WatchProjectsResponse]) error {
	sel, err := viewapi.Selected(ctx, s.gate, req.Msg.LabelSelector)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A project's status depends on its entry, its bindings, their desired objects and what the
	// agents report about them: subscribe to all four before taking the snapshot, so no change
	// falls between the two.
	projects := s.projects.Updates(ctx, 1024)
	bindings := s.bindings.Updates(ctx, 4096)
	desired := s.desired.Updates(ctx, 4096)
	applied := s.applied.Updates(ctx, 4096)

	shown := map[string]*projectv1.Project{}
	caller := authz.CallerFrom(ctx)
	send := func(name string) error {
		var cur *projectv1.Project
		// A project the caller may no longer see leaves the watch as if deleted.
		if p, ok := s.projects.Get(projectKey(name)); ok && sel.Matches(labels.Set(p.Labels)) && caller.Can("watch", roles.Group, roles.ResProjects, name) {
			cur = s.presentProject(p)
		}
		prev := shown[name]
		var typ projectv1.WatchProjectsResponse_EventType
		switch {
		case cur != nil && prev == nil:
			typ = projectv1.WatchProjectsResponse_EVENT_TYPE_ADDED
		case cur != nil && !proto.Equal(cur, prev):
			typ = projectv1.WatchProjectsResponse_EVENT_TYPE_MODIFIED
		case cur == nil && prev != nil:
			typ, cur = projectv1.WatchProjectsResponse_EVENT_TYPE_DELETED, prev
		default:
			return nil
		}
		if typ == projectv1.WatchProjectsResponse_EVENT_TYPE_DELETED {
			delete(shown, name)
		} else {
			shown[name] = cur
		}
		return stream.Send(&projectv1.WatchProjectsResponse{Type: typ, Project: cur})
	}
	for _, p := range s.projects.List(nil) {
		if err := send(p.Name); err != nil {
			return err
		}
	}
	dirty := map[string]bool{}
	var flush <-chan time.Time
	mark := func(names ...string) {
		for _, n := range names {
			if n != "" {
				dirty[n] = true
			}
		}
		if flush == nil && len(dirty) > 0 {
			flush = time.After(watchCoalesce)
		}
	}
	fellBehind := apierr.WatchFellBehind("namespace bindings")
	for {
		select {
		case <-ctx.Done():
			return nil
		case c, ok := <-projects:
			if !ok {
				return closed(ctx, fellBehind)
			}
			name, _ := keys.Decode(c.Key)
			mark(name)
		case c, ok := <-bindings:
			if !ok {
				return closed(ctx, fellBehind)
			}
			if c.Prev != nil {
				mark(c.Prev.Project)
			}
			if c.Op == view.Put {
				mark(c.Value.Project)
			}
		case c, ok := <-desired:
			if !ok {
				return closed(ctx, fellBehind)
			}
			mark(s.projectOfDesiredKey(c.Key))
		case c, ok := <-applied:
			if !ok {
				return closed(ctx, fellBehind)
			}
			mark(s.projectOfDesiredKey(strings.TrimPrefix(c.Key, keys.Encode(subjects.DesiredNamespacesBucket)+".")))
		case <-flush:
			flush = nil
			for name := range dirty {
				delete(dirty, name)
				if err := send(name); err != nil {
					return err
				}
			}
		}
	}
}

func closed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// projectOfDesiredKey returns the project whose binding a desired key belongs to, or "".
func (s *Service) projectOfDesiredKey(key string) string {
	if b, ok := s.bindings.Get(bindingKeyOfDesired(key)); ok {
		return b.Project
	}
	return ""
}
