package hosted

import (
	"context"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/util/workqueue"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/view"
)

const (
	// resyncEvery: every cluster is looked at again this often, changed or not. A safety net
	// only: a cluster left to its own agent is looked at again when the grace since its last
	// heartbeat runs out (decide's recheck), not on this tick.
	resyncEvery = 30 * time.Second
	// updatesBuffer is how far the supervisor may fall behind a cache's changes before the
	// cache cuts it off; it then resyncs.
	updatesBuffer = 1024
)

// registry is what the supervisor reads: the clusters view and the agents' statuses.
type registry struct {
	clusters *view.Cache[*clusterv1.Cluster]
	status   *view.Cache[*clusterv1.AgentStatus]
}

// queue holds the names of the clusters to reconcile; a name queued twice before it is
// taken is reconciled once, and one name is never reconciled by two workers at once.
type queue = workqueue.TypedRateLimitingInterface[string]

func newQueue() queue {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "hosted-agents"},
	)
}

// enqueue queues the cluster whose view key (of either cache) is key.
func (s *Supervisor) enqueue(q queue, key string) {
	name, err := keys.Decode(key)
	if err != nil {
		s.log.Warn("registry key that names no cluster; ignored", zap.String("key", key), zap.Error(err))
		return
	}
	q.Add(name)
}

// resync queues every registered cluster and every cluster hosted now (one deregistered
// since is stopped by its reconcile).
func (s *Supervisor) resync(q queue, r *registry) {
	for _, c := range r.clusters.List(nil) {
		q.Add(c.Name)
	}
	for _, name := range s.Hosting() {
		q.Add(name)
	}
}

// processNext reconciles one queued cluster; false once the queue is shut down.
func (s *Supervisor) processNext(ctx context.Context, q queue, r *registry) bool {
	name, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(name)
	recheck := s.reconcile(ctx, name, r)
	q.Forget(name)
	if recheck > 0 {
		// Its own agent's grace runs out then, unless a heartbeat queues it sooner.
		q.AddAfter(name, recheck)
	}
	return true
}
