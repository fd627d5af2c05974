package desired

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// byDesiredKey indexes managed objects by their desired-key annotation.
const byDesiredKey = "fleetstream.io/desired-key"

// informerSyncTimeout bounds the wait for a new informer's first list, e.g. when the agent's
// Kubernetes credentials may not list a kind: the caller fails and retries rather than hangs.
const informerSyncTimeout = 30 * time.Second

// managedObject is a cached managed object and the resource it belongs to.
type managedObject struct {
	gvr schema.GroupVersionResource
	obj *unstructured.Unstructured
}

// informerSet runs one label-filtered informer per resource the applier manages, started on
// first use: only objects carrying the managed-by label are cached, whatever the cluster holds.
type informerSet struct {
	dyn     dynamic.Interface
	onEvent func(obj any)

	mu    sync.Mutex
	ctx   context.Context // lifetime of every informer, set by start
	wg    sync.WaitGroup
	byGVR map[schema.GroupVersionResource]cache.SharedIndexInformer
}

func newInformerSet(dyn dynamic.Interface, onEvent func(obj any)) *informerSet {
	return &informerSet{dyn: dyn, onEvent: onEvent, byGVR: map[schema.GroupVersionResource]cache.SharedIndexInformer{}}
}

// start sets the lifetime of the informers ensure starts.
func (s *informerSet) start(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctx = ctx
}

// wait blocks until every informer has stopped (after the start context ended).
func (s *informerSet) wait() { s.wg.Wait() }

// ensure starts the informer of gvr unless it runs, and waits until its cache has synced.
func (s *informerSet) ensure(ctx context.Context, gvr schema.GroupVersionResource) error {
	s.mu.Lock()
	if s.ctx == nil {
		s.mu.Unlock()
		return fmt.Errorf("informers not started")
	}
	inf, ok := s.byGVR[gvr]
	if !ok {
		inf = dynamicinformer.NewFilteredDynamicInformer(s.dyn, gvr, metav1.NamespaceAll, 0,
			cache.Indexers{byDesiredKey: indexByDesiredKey},
			func(o *metav1.ListOptions) { o.LabelSelector = ManagedByLabel + "=" + ManagedByValue },
		).Informer()
		handler := cache.ResourceEventHandlerFuncs{
			AddFunc: s.onEvent,
			UpdateFunc: func(oldObj, newObj any) {
				if resourceVersion(oldObj) != resourceVersion(newObj) {
					s.onEvent(newObj)
				}
			},
			DeleteFunc: s.onEvent,
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			s.mu.Unlock()
			return fmt.Errorf("informer for %s: %w", gvr, err)
		}
		s.byGVR[gvr] = inf
		runCtx := s.ctx
		s.wg.Go(func() { inf.RunWithContext(runCtx) })
	}
	s.mu.Unlock()
	if inf.HasSynced() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, informerSyncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("informer for %s did not sync: %w", gvr, context.Cause(ctx))
	}
	return nil
}

// byKey returns the cached managed objects annotated with desired key qk, of every resource.
func (s *informerSet) byKey(qk string) ([]managedObject, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []managedObject
	for gvr, inf := range s.byGVR {
		objs, err := inf.GetIndexer().ByIndex(byDesiredKey, qk)
		if err != nil {
			return nil, fmt.Errorf("index %s: %w", gvr, err)
		}
		for _, o := range objs {
			if u, ok := o.(*unstructured.Unstructured); ok {
				out = append(out, managedObject{gvr: gvr, obj: u})
			}
		}
	}
	return out, nil
}

// cached returns a copy of the cached object namespace/name of gvr if it is managed for desired
// key qk. Objects we manage are always in the cache, so the common case (an update or removal
// of our own object) needs no GET; anything else (adoption, creation) is read from the server.
func (s *informerSet) cached(gvr schema.GroupVersionResource, namespace, name, qk string) (*unstructured.Unstructured, bool) {
	s.mu.Lock()
	inf, ok := s.byGVR[gvr]
	s.mu.Unlock()
	if !ok || !inf.HasSynced() {
		return nil, false
	}
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	o, ok, err := inf.GetIndexer().GetByKey(key)
	if err != nil || !ok {
		return nil, false
	}
	u, isU := o.(*unstructured.Unstructured)
	if !isU || !managedFor(u, qk) {
		return nil, false
	}
	return u.DeepCopy(), true
}

// lookup returns the cached managed object namespace/name of gvr, whatever its key; synced is
// false when no synced informer of gvr runs (the caller must ask the server). Only managed
// objects are cached, so a synced miss means the object is not managed.
func (s *informerSet) lookup(gvr schema.GroupVersionResource, namespace, name string) (obj *unstructured.Unstructured, synced bool) {
	s.mu.Lock()
	inf, ok := s.byGVR[gvr]
	s.mu.Unlock()
	if !ok || !inf.HasSynced() {
		return nil, false
	}
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	o, found, err := inf.GetIndexer().GetByKey(key)
	if err != nil {
		return nil, false
	}
	if !found {
		return nil, true
	}
	u, _ := o.(*unstructured.Unstructured)
	return u, true
}

// keys returns every desired key annotated on a cached managed object.
func (s *informerSet) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, inf := range s.byGVR {
		out = append(out, inf.GetIndexer().ListIndexFuncValues(byDesiredKey)...)
	}
	return out
}

func indexByDesiredKey(obj any) ([]string, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	if k := m.GetAnnotations()[DesiredKeyAnnotation]; k != "" {
		return []string{k}, nil
	}
	return nil, nil
}

// desiredKeyOf returns the desired-key annotation of an informer event's object, unwrapping
// the tombstone of a delete whose final state was missed.
func desiredKeyOf(obj any) string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetAnnotations()[DesiredKeyAnnotation]
}

func resourceVersion(obj any) string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetResourceVersion()
}
