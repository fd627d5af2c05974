package collector

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Weights are operator decisions, so they are events on FLEET_ENDPOINT (the source of truth,
// kept forever) projected into bucket `endpoint-weights`; endpoints are observations and only
// live in memory and in bucket `endpoints`. A restart replays both and comes back the same.

// weightsProjection folds FLEET_ENDPOINT into one ServiceWeights per service. Bump Version
// whenever applyWeights changes meaning: the view is then rebuilt from the stream.
func weightsProjection() view.Projection {
	return view.Projection{
		Name:     "endpoint-weights",
		Version:  1,
		Stream:   subjects.EndpointStream,
		Subjects: []string{subjects.EndpointPrefix + ".weight.>"},
		Bucket: jetstream.KeyValueConfig{Bucket: subjects.EndpointWeightsBucket,
			Description: "Endpoint and cluster weight overrides per service (projection of FLEET_ENDPOINT).",
			History:     1, Storage: jetstream.FileStorage},
		New:   func() proto.Message { return &endpointv1.ServiceWeights{} },
		Apply: applyWeights,
	}
}

func applyWeights(ev *events.Event) ([]view.Change, error) {
	tail, ok := strings.CutPrefix(ev.Subject, subjects.EndpointPrefix+".weight.")
	if !ok {
		return nil, fmt.Errorf("weight event on %s", ev.Subject)
	}
	parts, err := keys.Split(tail)
	if err != nil || len(parts) != 2 {
		return nil, fmt.Errorf("weight subject %s: want <namespace>.<name>", ev.Subject)
	}
	ns, name := parts[0], parts[1]
	change := func(f func(w *endpointv1.ServiceWeights)) []view.Change {
		return []view.Change{view.ChangeOf(viewKey(ns, name), func(w *endpointv1.ServiceWeights) *endpointv1.ServiceWeights {
			if w == nil {
				w = &endpointv1.ServiceWeights{Namespace: ns, Name: name}
			}
			f(w)
			if len(w.ClusterWeights) == 0 && len(w.EndpointWeights) == 0 {
				return nil // back to defaults everywhere: no entry
			}
			return w
		})}
	}
	switch p := ev.Payload.(type) {
	case *endpointv1.EndpointWeightSet:
		return change(func(w *endpointv1.ServiceWeights) {
			for _, b := range p.Bindings {
				w.EndpointWeights = slices.DeleteFunc(w.EndpointWeights, func(e *endpointv1.EndpointWeight) bool {
					return e.Ip == p.Ip && e.ClusterName == b.ClusterName
				})
				w.EndpointWeights = append(w.EndpointWeights, &endpointv1.EndpointWeight{Ip: p.Ip, ClusterName: b.ClusterName,
					ClusterId: b.ClusterId, TargetUid: b.TargetUid, Weight: p.Weight, SetTime: ev.GetTime()})
			}
			slices.SortFunc(w.EndpointWeights, func(a, b *endpointv1.EndpointWeight) int {
				return strings.Compare(a.ClusterName+"\x00"+a.Ip, b.ClusterName+"\x00"+b.Ip)
			})
		}), nil
	case *endpointv1.EndpointWeightCleared:
		return change(func(w *endpointv1.ServiceWeights) {
			w.EndpointWeights = slices.DeleteFunc(w.EndpointWeights, func(e *endpointv1.EndpointWeight) bool {
				return e.Ip == p.Ip && (p.ClusterName == "" || e.ClusterName == p.ClusterName)
			})
		}), nil
	case *endpointv1.ClusterWeightSet:
		return change(func(w *endpointv1.ServiceWeights) {
			if p.Weight == DefaultWeight {
				delete(w.ClusterWeights, p.ClusterName)
				return
			}
			if w.ClusterWeights == nil {
				w.ClusterWeights = map[string]uint32{}
			}
			w.ClusterWeights[p.ClusterName] = p.Weight
		}), nil
	}
	return nil, fmt.Errorf("unexpected event %s on %s", ev.Type, ev.Subject)
}

// weightsOf returns the weights of a service, nil when it has none (or before they are loaded).
func (c *Collector) weightsOf(ns, name string) *endpointv1.ServiceWeights {
	if c.weights == nil {
		return nil
	}
	w, _ := c.weights.Get(viewKey(ns, name))
	return w
}

// followWeights re-reconciles a service whenever its weights change, so its snapshot (and the
// bucket, and watchers) carry them.
func (c *Collector) followWeights(ctx context.Context) error {
	select {
	case <-c.weights.Ready():
	case <-ctx.Done():
		return nil
	}
	for {
		snap, ch := c.weights.Subscribe(ctx, 4096)
		for _, u := range snap {
			c.queue.Add(serviceKey(u.Value.Namespace, u.Value.Name))
		}
		for u := range ch {
			c.queue.Add(serviceKey(u.Value.Namespace, u.Value.Name))
		}
		if ctx.Err() != nil {
			return nil
		}
		// Fell behind: resubscribe, which re-queues everything once.
	}
}

// runWeightCleanup removes endpoint weights whose endpoint has been gone for longer than
// WeightCleanupAfter. Only clusters that are live and fully relisted are judged: a silent or
// resyncing cluster's endpoints are unknown, not gone. It runs in the writer (runWriter), after
// ready; the clock of "gone" starts when this replica became the writer.
func (c *Collector) runWeightCleanup(ctx context.Context) error {
	every := min(c.cfg.WeightCleanupAfter/4, time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	goneSince := map[string]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			c.cleanupWeights(ctx, goneSince)
		}
	}
}

func (c *Collector) cleanupWeights(ctx context.Context, goneSince map[string]time.Time) {
	now := c.now()
	seen := map[string]bool{}
	for _, w := range c.weights.List(nil) {
		sn := c.store.state(serviceKey(w.Namespace, w.Name))
		for _, ew := range w.EndpointWeights {
			id := w.Namespace + "/" + w.Name + "/" + ew.ClusterName + "/" + ew.Ip
			ci := c.store.cluster(ew.ClusterName)
			if ci.State() != stateLive || ci.lastSeen.Load() == 0 || present(sn, ew) {
				continue
			}
			seen[id] = true
			since, ok := goneSince[id]
			if !ok {
				goneSince[id] = now
				continue
			}
			if now.Sub(since) < c.cfg.WeightCleanupAfter {
				continue
			}
			// Expect the entry's revision: a weight set again meanwhile is not cleared.
			_, err := c.events.Append(ctx, subjects.EndpointWeight(w.Namespace, w.Name), viewKey(w.Namespace, w.Name),
				events.At(w.Revision), &endpointv1.EndpointWeightCleared{Namespace: w.Namespace, Name: w.Name, Ip: ew.Ip,
					ClusterName: ew.ClusterName, Reason: "gone"})
			if err != nil {
				if !events.IsConflict(err) {
					c.log.Warn("clean up endpoint weight", zap.String("service", w.Namespace+"/"+w.Name), zap.String("ip", ew.Ip), zap.Error(err))
				}
				continue
			}
			c.log.Info("endpoint weight cleaned up: its endpoint is gone", zap.String("service", w.Namespace+"/"+w.Name),
				zap.String("cluster", ew.ClusterName), zap.String("ip", ew.Ip))
			delete(goneSince, id)
			break // the entry's revision moved on; the rest is judged next time
		}
	}
	for id := range goneSince {
		if !seen[id] {
			delete(goneSince, id) // came back, or cleared
		}
	}
}

// present reports whether the endpoint a weight was set for is in the service now.
func present(sn *snapshot, ew *endpointv1.EndpointWeight) bool {
	if sn == nil {
		return false
	}
	a, err := netip.ParseAddr(ew.Ip)
	if err != nil {
		return false
	}
	addr, _ := addrBytes(a)
	o := override{addr: addr}
	if ew.TargetUid != "" {
		o.uid, o.hasUID = uidBytes(ew.TargetUid), true
	}
	for ci := range sn.clusters {
		cs := &sn.clusters[ci]
		if cs.name() != ew.ClusterName {
			continue
		}
		for si := range cs.nslices() {
			s := cs.slice(si)
			for i := range s.n() {
				if e := s.ep(i); e.addr == o.addr && (!o.hasUID || (e.flags&fHasUID != 0 && e.uid == o.uid)) {
					return true
				}
			}
		}
	}
	return false
}

// deadLetter parks a malformed agent report.
func deadLetter(ctx context.Context, js jetstream.JetStream, m jetstream.Msg, cause error) error {
	return consumer.DeadLetter(ctx, js, subjects.AgentStreamName, "endpoint-collector", m, cause)
}
