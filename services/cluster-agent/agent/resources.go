package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"go.uber.org/zap"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
)

// The resources summed over nodes: what placement's ResourceAllocatableCPU and
// ResourceAllocatableMemory prioritizers score.
var summedResources = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}

// resourcesKey is the only key of the recount queue: every node event asks for the same
// recount, so the queue collapses a burst into one.
const resourcesKey = "resources"

// nodeResources keeps the sums over the cluster's Ready nodes from a Node informer and tells the
// heartbeater when they change. Kubelets rewrite node status every few minutes (and on every
// condition change), so most events change nothing: the sums are recounted after a debounce and
// compared, and only a different result wakes the heartbeater.
//
// The informer has a factory of its own, not the agent's shared one: Run waits for every
// informer of the shared factory before starting the appliers, and an agent whose identity may
// not list nodes must still apply desired state (its heartbeats then carry no resources).
// Nothing else in the agent watches nodes.
type nodeResources struct {
	log      *zap.Logger
	debounce time.Duration
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	lister   corelisters.NodeLister
	// changed holds one pending wake-up for the heartbeater; a full channel already says it.
	changed chan struct{}

	mu      sync.Mutex
	current *agentv1.ClusterResources // nil until the informer has synced
	// Node events by number, in the order the informer delivered them: seen counts them,
	// asked is the number of the last one that asked for a recount, and counted the last one
	// a finished recount covered (every event up to it). Nothing in the agent needs them; they
	// are how a test knows that an event changed nothing rather than not having arrived yet.
	seen, asked, counted uint64
	// changes counts the recounts whose sums differed, each of which wakes the heartbeater.
	changes uint64
}

func newNodeResources(a *Agent) *nodeResources {
	factory := informers.NewSharedInformerFactory(a.kube, 0)
	nodes := factory.Core().V1().Nodes()
	return &nodeResources{
		log: a.log, debounce: a.cfg.ResourcesDebounce, factory: factory,
		informer: nodes.Informer(), lister: nodes.Lister(), changed: make(chan struct{}, 1),
	}
}

// Current returns the latest sums, or nil while they are unknown. The result is the
// caller's.
func (r *nodeResources) Current() *agentv1.ClusterResources {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current == nil {
		return nil
	}
	return proto.CloneOf(r.current)
}

// Changed is signalled when Current changes.
func (r *nodeResources) Changed() <-chan struct{} { return r.changed }

// Run watches nodes until ctx ends. It never fails: without nodes the heartbeats go on without
// resources.
func (r *nodeResources) Run(ctx context.Context) error {
	q := workqueue.NewTypedDelayingQueue[string]()
	defer q.ShutDown()
	event := func(recount bool) {
		r.mu.Lock()
		r.seen++
		if recount {
			r.asked = r.seen
		}
		r.mu.Unlock()
		if recount {
			q.AddAfter(resourcesKey, r.debounce)
		}
	}
	reg, err := r.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { event(true) },
		UpdateFunc: func(oldObj, newObj any) { event(nodeResourcesChanged(oldObj, newObj)) },
		DeleteFunc: func(any) { event(true) },
	})
	if err != nil {
		return fmt.Errorf("watch nodes for resources: %w", err)
	}
	defer func() { _ = r.informer.RemoveEventHandler(reg) }()
	r.factory.Start(ctx.Done())
	// Shutdown waits for the informer's goroutines, so none outlives Run.
	defer r.factory.Shutdown()

	for synced := false; !synced; {
		wait, cancel := context.WithTimeout(ctx, 30*time.Second)
		synced = cache.WaitForCacheSync(wait.Done(), reg.HasSynced)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if !synced {
			r.log.Warn("node informer not synced yet: heartbeats carry no resources until it is (may the agent's Kubernetes identity list and watch nodes?)")
		}
	}
	r.recount()
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	for {
		key, shutdown := q.Get()
		if shutdown {
			return nil
		}
		r.recount()
		q.Done(key)
	}
}

// settled returns how many node events the sums are final for: all seen when none waits for a
// recount, else those the last finished recount covered. A change the events made has been
// signalled to the heartbeater by then.
func (r *nodeResources) settled() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asked <= r.counted {
		return r.seen
	}
	return r.counted
}

// recount sums the informer's nodes and signals a change.
func (r *nodeResources) recount() {
	// The lister already holds every event delivered so far: this recount covers them.
	r.mu.Lock()
	upTo := r.seen
	r.mu.Unlock()
	nodes, err := r.lister.List(labels.Everything())
	if err != nil {
		// A lister over a synced cache does not fail; keep the last sums if it ever does.
		r.log.Warn("list nodes from the informer cache", zap.Error(err))
		return
	}
	next := sumNodes(nodes)
	r.mu.Lock()
	same := proto.Equal(r.current, next)
	if !same {
		r.current = next
		r.changes++
	}
	r.mu.Unlock()
	if !same {
		r.log.Debug("node resources changed", zap.Int32("readyNodes", next.NodeCount),
			zap.Any("allocatable", next.Allocatable), zap.Any("capacity", next.Capacity))
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
	// Counted only once the heartbeater has been signalled, so that settled implies the signal.
	r.mu.Lock()
	r.counted = max(r.counted, upTo)
	r.mu.Unlock()
}

// sumNodes adds up the Ready nodes: capacity over all of them and allocatable over those that
// are not cordoned, as Open Cluster Management does (a cordoned node takes no new work). Every
// summed resource is present, "0" when nothing counts, so a consumer tells zero from unknown.
func sumNodes(nodes []*corev1.Node) *agentv1.ClusterResources {
	var alloc, capacity corev1.ResourceList = make(corev1.ResourceList), make(corev1.ResourceList)
	var ready int32
	for _, n := range nodes {
		if !nodeReady(n) {
			continue
		}
		ready++
		for _, name := range summedResources {
			addQuantity(capacity, n.Status.Capacity, name)
			if !n.Spec.Unschedulable {
				addQuantity(alloc, n.Status.Allocatable, name)
			}
		}
	}
	out := &agentv1.ClusterResources{
		Allocatable: make(map[string]string, len(summedResources)),
		Capacity:    make(map[string]string, len(summedResources)),
		NodeCount:   ready,
	}
	for _, name := range summedResources {
		out.Allocatable[string(name)] = canonical(name, alloc[name])
		out.Capacity[string(name)] = canonical(name, capacity[name])
	}
	return out
}

func addQuantity(sum, node corev1.ResourceList, name corev1.ResourceName) {
	q, ok := node[name]
	if !ok {
		return
	}
	cur := sum[name]
	cur.Add(q)
	sum[name] = cur
}

// canonical prints a sum in one notation per resource whatever notations the nodes used (a sum
// takes the format of whichever node came first, and the lister's order is random): equal sums
// must print equal, or every recount would look like a change.
func canonical(name corev1.ResourceName, q resource.Quantity) string {
	if name == corev1.ResourceMemory {
		return resource.NewQuantity(q.Value(), resource.BinarySI).String()
	}
	return resource.NewMilliQuantity(q.MilliValue(), resource.DecimalSI).String()
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// nodeResourcesChanged reports whether an update can change the sums. Most node updates only
// move heartbeat times of conditions, images or annotations.
func nodeResourcesChanged(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	if nodeReady(o) != nodeReady(n) || o.Spec.Unschedulable != n.Spec.Unschedulable {
		return true
	}
	for _, name := range summedResources {
		if !quantityEqual(o.Status.Capacity, n.Status.Capacity, name) || !quantityEqual(o.Status.Allocatable, n.Status.Allocatable, name) {
			return true
		}
	}
	return false
}

func quantityEqual(a, b corev1.ResourceList, name corev1.ResourceName) bool {
	qa, oka := a[name]
	qb, okb := b[name]
	return oka == okb && qa.Cmp(qb) == 0
}
