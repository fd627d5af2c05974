package agent

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/nsinventory"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// inventoryKey is the only key in the inventory queue: every change asks for the same thing, a
// fresh report of the whole list, so the queue's de-duplication collapses bursts.
const inventoryKey = "inventory"

// Backoff of a failed inventory publish (NATS down, stream not created yet).
const (
	inventoryRetryBase = 500 * time.Millisecond
	inventoryRetryMax  = 30 * time.Second
)

// inventoryReporter publishes the whole namespace list on start, after every change of the set
// or of a namespace's labels or phase (debounced), and every InventoryResync.
type inventoryReporter struct {
	agent    *Agent
	informer cache.SharedIndexInformer
	lister   corelisters.NamespaceLister

	// Used by the Run loop only.
	// published is one more than the highest chunk index this reporter may have left on the
	// stream, so chunks a shrunk inventory no longer uses are emptied. It starts at 0: the
	// leftovers of a previous process are not known (an agent may not read FLEET_AGENT) and
	// stay, overruled by the newer chunks that cover their namespaces (nsinventory.Assemble).
	published uint32
	// generation is the last generation used, so that generations grow even if the clock does
	// not. Readers order chunks by stream sequence, not by generation.
	generation uint64
	// sent holds a digest of the namespaces of each chunk on the stream, of a split into
	// sentOf chunks, and lastFull when every chunk was last published: while the count stays,
	// a change republishes only the chunks it touched, and each InventoryResync all of them.
	sent     map[uint32][sha256.Size]byte
	sentOf   uint32
	lastFull time.Time
}

func newInventoryReporter(a *Agent) *inventoryReporter {
	// Registering the informer here, before Run starts the factory, makes Run wait for its cache.
	nsInformer := a.factory.Core().V1().Namespaces()
	return &inventoryReporter{agent: a, informer: nsInformer.Informer(), lister: nsInformer.Lister()}
}

func (r *inventoryReporter) Run(ctx context.Context) error {
	a := r.agent
	q := workqueue.NewTypedRateLimitingQueue(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](inventoryRetryBase, inventoryRetryMax))
	defer q.ShutDown()

	// AddAfter keeps only the earliest pending time per key, so events within the debounce
	// window after the first one ride along with it.
	changed := func() { q.AddAfter(inventoryKey, a.cfg.InventoryDebounce) }
	reg, err := r.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { changed() },
		UpdateFunc: func(oldObj, newObj any) {
			if inventoryChanged(oldObj, newObj) {
				changed()
			}
		},
		DeleteFunc: func(any) { changed() },
	})
	if err != nil {
		return fmt.Errorf("watch namespaces for inventory: %w", err)
	}
	defer func() { _ = r.informer.RemoveEventHandler(reg) }()

	q.Add(inventoryKey)
	go func() {
		t := time.NewTicker(a.cfg.InventoryResync)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				q.ShutDown()
				return
			case <-t.C:
				q.Add(inventoryKey)
			}
		}
	}()

	failing := false
	for {
		key, shutdown := q.Get()
		if shutdown {
			return nil
		}
		err := r.publish(ctx)
		switch {
		case err == nil:
			q.Forget(key)
			if failing {
				failing = false
				a.log.Info("namespace inventory published again")
			}
		case ctx.Err() != nil:
			// Shutting down.
		default:
			q.AddRateLimited(key)
			if !failing {
				failing = true
				a.log.Warn("namespace inventory not published; retrying with backoff", zap.Error(err))
			} else {
				a.log.Debug("namespace inventory not published", zap.Error(err))
			}
		}
		q.Done(key)
	}
}

func (r *inventoryReporter) publish(ctx context.Context) error {
	inv, err := r.snapshot()
	if err != nil {
		return err
	}
	a := r.agent
	start := time.Now()
	budget := a.cfg.InventoryChunkBytes
	if budget <= 0 {
		budget = int(a.js.Conn().MaxPayload()) / 4
	}
	gen := max(uint64(inv.Time.AsTime().UnixNano()), r.generation+1)
	chunks := nsinventory.Split(inv, budget, gen)
	n := uint32(len(chunks))
	if n > 1 || r.published > 1 {
		r.generation = gen
	}
	if n == 1 && r.published > 1 {
		// The list fits again: chunk 0 says so, in the generation of the emptied leftovers.
		chunks[0].Generation, chunks[0].Chunks = gen, 1
	}
	// A chunk whose namespaces are what the stream holds for its index under the same count
	// need not go out again: a reader merges chunks of different generations of one count
	// (each namespace is in one index). Every InventoryResync, and after a failed publish, all
	// of them go out anyway; an unchunked inventory always does, as it did before chunks.
	full := n == 1 || n != r.sentOf || time.Since(r.lastFull) >= a.cfg.InventoryResync
	if n != r.sentOf {
		r.sent, r.sentOf = map[uint32][sha256.Size]byte{}, n
	}
	// Highest index first: a new chunk then replaces only a chunk whose namespaces all belong
	// to new chunks already published (while the count grows, new chunk j replaces old chunk
	// j, whose namespaces go to j, j+old count, …), so a reader sees every namespace from its
	// new chunk or from the chunk that held it before (see nsinventory). The leftovers go
	// last, once the new chunks covering their namespaces are out.
	skipped := 0
	for i := int(n) - 1; i >= 0; i-- {
		sum, err := namespacesDigest(chunks[i])
		if err != nil {
			return err
		}
		if old, ok := r.sent[uint32(i)]; ok && old == sum && !full {
			skipped++
			continue
		}
		if err := a.appendReport(ctx, subjects.AgentInventoryChunk(a.cfg.ClusterName, uint32(i)), chunks[i]); err != nil {
			r.sent, r.sentOf = nil, 0 // whatever the stream holds now, the next publish is full
			return err
		}
		r.sent[uint32(i)] = sum
		r.published = max(r.published, uint32(i)+1)
	}
	// Chunks a larger inventory used, emptied so they do not linger (readers ignore them
	// anyway: every namespace they hold is covered by a newer chunk now).
	for i := n; i < r.published; i++ {
		empty := &agentv1.NamespaceInventory{ClusterName: inv.ClusterName, Time: inv.Time, Generation: gen, Chunk: i, Chunks: n}
		if err := a.appendReport(ctx, subjects.AgentInventoryChunk(a.cfg.ClusterName, i), empty); err != nil {
			return err
		}
	}
	if full {
		r.lastFull = time.Now()
	}
	r.published = n
	a.log.Debug("namespace inventory published", zap.Int("namespaces", len(inv.Namespaces)),
		zap.Uint32("chunks", n), zap.Int("unchanged", skipped), zap.Duration("took", time.Since(start)))
	return nil
}

// snapshot builds the inventory from the informer cache, sorted by name so equal sets give
// equal messages.
func (r *inventoryReporter) snapshot() (*agentv1.NamespaceInventory, error) {
	nss, err := r.lister.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	slices.SortFunc(nss, func(x, y *corev1.Namespace) int { return strings.Compare(x.Name, y.Name) })
	inv := &agentv1.NamespaceInventory{
		ClusterName: r.agent.cfg.ClusterName,
		Namespaces:  make([]*agentv1.Namespace, 0, len(nss)),
		Time:        timestamppb.Now(),
	}
	for _, ns := range nss {
		inv.Namespaces = append(inv.Namespaces, &agentv1.Namespace{
			Name: ns.Name,
			// The cache's objects are shared; never hand out their maps.
			Labels: maps.Clone(ns.Labels),
			Phase:  string(ns.Status.Phase),
		})
	}
	return inv, nil
}

// namespacesDigest digests what a chunk says about namespaces (not its time or generation).
func namespacesDigest(c *agentv1.NamespaceInventory) ([sha256.Size]byte, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(&agentv1.NamespaceInventory{Namespaces: c.Namespaces, Chunks: c.Chunks})
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("encode inventory chunk: %w", err)
	}
	return sha256.Sum256(b), nil
}

// inventoryChanged reports whether an update touched what the inventory carries; most updates
// (annotations, managed fields, finalizers) do not.
func inventoryChanged(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*corev1.Namespace)
	n, ok2 := newObj.(*corev1.Namespace)
	if !ok1 || !ok2 {
		return true
	}
	return o.Status.Phase != n.Status.Phase || !maps.Equal(o.Labels, n.Labels)
}
