package agent

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// The import watcher reports, beside the objects, how it fares with each type it was asked to
// watch (agentv1.ImportWatchStatus): without it a policy whose source type the cluster does
// not serve, or that the agent may not list, imports nothing and only this log says why.

// Reasons of agentv1.WatchedTypeStatus.
const (
	WatchNotServed    = "NotServed"
	WatchForbidden    = "Forbidden"
	WatchUnauthorized = "Unauthorized"
	WatchFailed       = "WatchFailed"
)

const (
	// ImportStatusMaxMessage bounds the error text of one type in a status report.
	ImportStatusMaxMessage = 512
	// ImportStatusMaxTypes bounds the types of one status report, sources first.
	ImportStatusMaxTypes = 256
	// importStatusEvery is the least time between two status reports: an error repeated by
	// every retry of a reflector changes nothing, but one that alternates must not flood the hub.
	importStatusEvery = 250 * time.Millisecond
)

type typeStatus struct {
	// gen is the informer run the entry belongs to: a stopped run's late list or watch
	// result must not change its successor's entry.
	gen                      string
	version, reason, message string
	synced                   bool
	since                    time.Time
}

// importStatus is what the next ImportWatchStatus says, by informer.
type importStatus struct {
	mu      sync.Mutex
	types   map[informerKey]*typeStatus
	changed chan struct{}
}

func newImportStatus() *importStatus {
	return &importStatus{types: map[informerKey]*typeStatus{}, changed: make(chan struct{}, 1)}
}

func (s *importStatus) poke() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// update applies f to k's entry (creating it when create is set; a gen mismatch leaves it
// alone) and pokes the reporter when anything changed.
func (s *importStatus) update(k informerKey, gen string, create bool, f func(*typeStatus)) {
	s.mu.Lock()
	cur := s.types[k]
	switch {
	case cur == nil && !create:
		s.mu.Unlock()
		return
	case cur == nil:
		cur = &typeStatus{gen: gen, since: time.Now()}
		s.types[k] = cur
	case cur.gen != gen && !create:
		s.mu.Unlock()
		return
	}
	before := *cur
	cur.gen = gen
	f(cur)
	if cur.reason != before.reason || cur.synced != before.synced {
		cur.since = time.Now()
	}
	changed := *cur != before
	s.mu.Unlock()
	if changed || create {
		s.poke()
	}
}

// failed records that k cannot be watched (its informer, if any, keeps retrying).
func (s *importStatus) failed(k informerKey, gen string, create bool, err error) {
	reason, msg := watchReason(err), clip(err.Error(), ImportStatusMaxMessage)
	s.update(k, gen, create, func(t *typeStatus) {
		t.reason, t.message = reason, msg
		if reason == WatchNotServed {
			t.version = ""
		}
	})
}

// ok records that k's informer listed or watched successfully.
func (s *importStatus) ok(k informerKey, gen string) {
	s.update(k, gen, false, func(t *typeStatus) { t.reason, t.message = "", "" })
}

// keep drops the entries of types no longer wanted.
func (s *importStatus) keep(want map[informerKey]string) {
	s.mu.Lock()
	n := len(s.types)
	for k := range s.types {
		if _, ok := want[k]; !ok {
			delete(s.types, k)
		}
	}
	dropped := len(s.types) != n
	s.mu.Unlock()
	if dropped {
		s.poke()
	}
}

// snapshot returns the report: every source type, and the reference types that fail.
func (s *importStatus) snapshot() []*agentv1.WatchedTypeStatus {
	s.mu.Lock()
	out := make([]*agentv1.WatchedTypeStatus, 0, len(s.types))
	for k, t := range s.types {
		if !k.source && t.reason == "" {
			continue
		}
		out = append(out, &agentv1.WatchedTypeStatus{Group: k.group, Resource: k.resource, Namespace: k.namespace, Source: k.source,
			Version: t.version, Reason: t.reason, Message: t.message, Synced: t.synced, Since: timestamppb.New(t.since)})
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b *agentv1.WatchedTypeStatus) int {
		if a.Source != b.Source {
			if a.Source {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Group+"/"+a.Resource+"/"+a.Namespace, b.Group+"/"+b.Resource+"/"+b.Namespace)
	})
	if len(out) > ImportStatusMaxTypes {
		out = out[:ImportStatusMaxTypes]
	}
	return out
}

// watchReason classifies why a type cannot be watched.
func watchReason(err error) string {
	switch {
	case meta.IsNoMatchError(err), apierrors.IsNotFound(err):
		return WatchNotServed
	case apierrors.IsForbidden(err):
		return WatchForbidden
	case apierrors.IsUnauthorized(err):
		return WatchUnauthorized
	}
	return WatchFailed
}

// clip cuts s to at most n bytes on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// newInformer is dynamicinformer's informer for k, whose every list and watch call also
// records in the status whether it worked: the reflector only logs its errors, and says
// nothing when it recovers.
func (w *ImportWatcher) newInformer(gvr schema.GroupVersionResource, k informerKey, gen string) cache.SharedIndexInformer {
	res := w.dyn.Resource(gvr).Namespace(k.namespace)
	note := func(ctx context.Context, err error) {
		switch {
		case ctx.Err() != nil:
			// The informer stopped: not the type's fault.
		case err != nil:
			w.status.failed(k, gen, false, err)
		default:
			w.status.ok(k, gen)
		}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l, err := res.List(ctx, o)
			note(ctx, err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			wi, err := res.Watch(ctx, o)
			note(ctx, err)
			return wi, err
		},
	}
	return cache.NewSharedIndexInformerWithOptions(lw, &unstructured.Unstructured{},
		cache.SharedIndexInformerOptions{ObjectDescription: gvr.String()})
}

// reportStatus publishes the status whenever it changes, at most every importStatusEvery.
func (w *ImportWatcher) reportStatus(ctx context.Context) {
	var last []*agentv1.WatchedTypeStatus
	sent := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.status.changed:
		}
		types := w.status.snapshot()
		if !sent || !slices.EqualFunc(types, last, func(a, b *agentv1.WatchedTypeStatus) bool { return proto.Equal(a, b) }) {
			c := w.a.cfg.ClusterName
			err := w.a.appendReport(ctx, subjects.AgentImportWatchStatus(c), &agentv1.ImportWatchStatus{
				ClusterName: c, SessionId: w.a.sessionID, Time: timestamppb.Now(), Types: types})
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				w.log.Warn("import watch status not reported; retrying", zap.Error(err))
				w.status.poke()
			} else {
				last, sent = types, true
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(importStatusEvery):
		}
	}
}
