package clusterimport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// runHeartbeats records each agent heartbeat in bucket cluster-status, marks a cluster
// connected when heartbeats (re)appear and records the resources they carry when these change. Only the latest heartbeat per cluster matters, so after
// a restart the consumer starts from the last one of each.
func (s *Registry) runHeartbeats(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	return consumer.Run(ctx, s.js, consumer.Config{
		Stream:         subjects.AgentStreamName,
		Durable:        "cluster-import-heartbeats",
		FilterSubjects: []string{subjects.AgentPrefix + ".*.heartbeat"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		MaxAckPending:  1024,
		// A heartbeat's handler waits on a few round trips to JetStream (a write, and for a
		// joining cluster two appends); with 4 workers a fleet joining at 100 clusters a second
		// queued behind them for seconds (docs/scale.md).
		Workers: heartbeatWorkers,
	}, s.log, s.handleHeartbeat)
}

// handleHeartbeat handles a heartbeat stored on FLEET_AGENT, as agents before the live subject
// sent them (and tests still append them).
func (s *Registry) handleHeartbeat(ctx context.Context, m jetstream.Msg) error {
	ev, err := events.DecodeMsg(m)
	if err != nil {
		return consumer.Permanent(err)
	}
	raw, ok := ev.Payload.(*agentv1.Heartbeat)
	if !ok {
		return consumer.Permanent(fmt.Errorf("unexpected %s on %s", ev.Type, m.Subject()))
	}
	md, err := m.Metadata()
	if err != nil {
		return consumer.Permanent(err)
	}
	// The server's receive time, not the agent's clock: liveness must not depend on clock skew.
	seen := md.Timestamp
	if s.now().Sub(seen) > s.cfg.UnreachableAfter {
		return nil // an old heartbeat replayed after a restart says nothing about now
	}
	b, err := s.prepareHeartbeat(m.Subject(), raw, seen)
	if err == nil && b != nil {
		err = s.applyHeartbeat(ctx, b)
	}
	if errors.Is(err, errMalformedHeartbeat) {
		return consumer.Permanent(err)
	}
	return err
}

// errMalformedHeartbeat marks a heartbeat that can never be handled.
var errMalformedHeartbeat = errors.New("malformed heartbeat")

// runLiveHeartbeats handles the heartbeats agents send on core NATS (subjects.LivePrefix), one
// replica each (a queue group), with heartbeatWorkers workers. Nothing is stored or
// redelivered: a heartbeat that fails is made good by the agent's next one, since each carries
// everything. Seen is this replica's clock when it arrives, as JetStream's receive time was.
func (s *Registry) runLiveHeartbeats(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	// Most heartbeats say nothing new and are done with in the subscription's own callback;
	// only those that write go to a worker. Handing every one to a worker woke a goroutine per
	// heartbeat, which on a quiet hub cost more than the handling (docs/scale.md).
	work := make(chan *preparedHeartbeat, liveHeartbeatBuffer)
	sub, err := s.js.Conn().QueueSubscribe(subjects.AgentLiveHeartbeats, liveHeartbeatQueue, func(m *nats.Msg) {
		if b := s.prepareLiveHeartbeat(m); b != nil {
			select {
			case work <- b:
			case <-ctx.Done():
			}
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subjects.AgentLiveHeartbeats, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	var wg sync.WaitGroup
	for range heartbeatWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case b := <-work:
					s.liveHeartbeatDone(ctx, b, s.applyHeartbeat(ctx, b))
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

// The live heartbeats' queue group, and how many may wait for a worker (a few seconds of a
// 10,000-cluster fleet reconnecting at once; past it the client drops them as a slow consumer,
// and the agents' next ones count).
const (
	liveHeartbeatQueue  = "cluster-import"
	liveHeartbeatBuffer = 16384
)

// prepareLiveHeartbeat decodes and checks one heartbeat from core NATS, and returns it if it
// has something to write (nil if not, or if it is malformed).
func (s *Registry) prepareLiveHeartbeat(m *nats.Msg) *preparedHeartbeat {
	raw := &agentv1.Heartbeat{}
	var b *preparedHeartbeat
	err := proto.Unmarshal(m.Data, raw)
	if err != nil {
		err = fmt.Errorf("%w: %v", errMalformedHeartbeat, err)
	} else {
		b, err = s.prepareHeartbeat(m.Subject, raw, s.now())
	}
	if err != nil {
		s.liveHeartbeatDone(context.Background(), &preparedHeartbeat{subject: m.Subject}, err)
		return nil
	}
	return b
}

// liveHeartbeatDone counts and logs (at debug level only: in a JetStream outage every heartbeat
// of the fleet fails alike) what became of a heartbeat from core NATS.
func (s *Registry) liveHeartbeatDone(ctx context.Context, b *preparedHeartbeat, err error) {
	switch {
	case err == nil || ctx.Err() != nil:
	case errors.Is(err, errMalformedHeartbeat):
		s.metrics.liveDropped.WithLabelValues("malformed").Inc()
		s.log.Debug("malformed heartbeat dropped", zap.String("subject", b.subject), zap.Error(err))
	default:
		s.metrics.liveDropped.WithLabelValues("failed").Inc()
		s.log.Debug("heartbeat not recorded; the agent's next one will be", zap.String("subject", b.subject), zap.Error(err))
	}
}

// preparedHeartbeat is a checked heartbeat that has something to write.
type preparedHeartbeat struct {
	subject, tok, name string
	raw, hb            *agentv1.Heartbeat
	problems           []string
	st                 *clusterv1.AgentStatus
	seen               time.Time
}

// prepareHeartbeat checks raw, received on subject at seen, and counts it; it returns nil when
// the heartbeat has nothing to write (nothingNew), else what applyHeartbeat writes.
func (s *Registry) prepareHeartbeat(subject string, raw *agentv1.Heartbeat, seen time.Time) (*preparedHeartbeat, error) {
	// What is out of bounds is dropped here, before anything is stored (agentlimits.go).
	tok, err := subjectToken(subject, 2)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errMalformedHeartbeat, err)
	}
	name, err := keys.Decode(tok)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errMalformedHeartbeat, err)
	}
	hb, problems := raw, []string(nil)
	if !s.valid.sameAs(tok, raw) {
		if hb, problems = checkHeartbeat(raw); len(problems) == 0 {
			s.valid.remember(tok, raw)
		}
	}
	st := &clusterv1.AgentStatus{ClusterName: name, KubernetesVersion: hb.KubernetesVersion,
		AgentVersion: hb.AgentVersion, SessionId: hb.SessionId, LastSeen: timestamppb.New(seen), Hosted: hb.Hosted}
	if !hb.Hosted {
		st.InClusterLastSeen = st.LastSeen
	}
	s.metrics.heartbeats.WithLabelValues(name).Inc()
	if s.nothingNew(tok, name, st, hb, problems) {
		return nil, nil
	}
	return &preparedHeartbeat{subject: subject, tok: tok, name: name, raw: raw, hb: hb, problems: problems, st: st, seen: seen}, nil
}

// applyHeartbeat records a prepared heartbeat and moves its facts onto its cluster.
func (s *Registry) applyHeartbeat(ctx context.Context, b *preparedHeartbeat) error {
	tok, name, raw, hb, problems, st, seen := b.tok, b.name, b.raw, b.hb, b.problems, b.st, b.seen
	newest, err := s.recordHeartbeat(ctx, tok, st)
	if err != nil {
		return err
	}
	// Only the newest heartbeat may move the cluster's facts (its connection, Kubernetes version
	// and resources): workers (and replicas) finish out of order, and a retried older one must
	// not undo a newer one (it did: a heartbeat retried after a conflict marked the cluster
	// connected with the version it had before an upgrade). The newest one's handler marks
	// them, retried until it does. What a race still lets through the next heartbeat puts
	// right.
	if !newest {
		return nil
	}
	if err := s.reportHeartbeat(ctx, name, problems); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		rev, err := s.heartbeatFacts(ctx, name, raw, hb, seen)
		if !events.IsConflict(err) || attempt == heartbeatConflictAttempts {
			return err
		}
		// The registry's cache had not caught up with the cluster's latest event (a joining
		// cluster's agent heartbeats while its registration is still being projected): wait
		// for it here. The redelivery backoff (250 ms, 1 s, 5 s, …) held a joining fleet's
		// Connected back by seconds (docs/scale.md).
		wctx, cancel := context.WithTimeout(ctx, heartbeatConflictWait)
		_ = s.clusters.WaitFor(wctx, clusterKey(name), func(c *clusterv1.Cluster, ok bool) bool { return !ok || c.Revision != rev })
		cancel()
	}
}

// heartbeatWorkers handle heartbeats in parallel; those of one cluster are ordered by the
// compare-and-set in recordHeartbeat, not by the queue.
const heartbeatWorkers = 32

// How often, and how long each time, a heartbeat whose facts lost a race with another change
// of its cluster waits for the registry's cache before it is redelivered with backoff.
const (
	heartbeatConflictAttempts = 4
	heartbeatConflictWait     = 2 * time.Second
)

// heartbeatFacts moves the facts of the newest heartbeat onto its cluster: connected, its
// versions and its resources. It returns the cluster revision it decided on.
func (s *Registry) heartbeatFacts(ctx context.Context, name string, raw, hb *agentv1.Heartbeat, seen time.Time) (uint64, error) {
	c, ok := s.clusters.Get(clusterKey(name))
	if !ok {
		return 0, nil // an agent of a cluster not (or no longer) registered
	}
	decided := c.Revision
	// A dropped version leaves the cluster's as it was: no event for it.
	if hb.KubernetesVersion == "" && raw.KubernetesVersion != "" {
		hb.KubernetesVersion = c.GetStatus().GetKubernetesVersion()
	}
	if hb.AgentVersion == "" && raw.AgentVersion != "" {
		hb.AgentVersion = c.GetStatus().GetAgentVersion()
	}
	rev, err := s.markConnected(ctx, c, hb, seen)
	if err != nil {
		return decided, err
	}
	if hb.Resources == nil {
		return decided, nil
	}
	return decided, s.recordResources(ctx, c, rev, hb.Resources, seen)
}

// markConnected appends ClusterAgentConnected unless c is connected with hb's Kubernetes
// version already, and returns the cluster's revision after it.
func (s *Registry) markConnected(ctx context.Context, c *clusterv1.Cluster, hb *agentv1.Heartbeat, seen time.Time) (uint64, error) {
	if cond := Condition(c, ConditionAgentConnected); cond != nil && cond.Status == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE &&
		c.Status.KubernetesVersion == hb.KubernetesVersion && c.Status.AgentHosted == hb.Hosted {
		return c.Revision, nil
	}
	rev, err := s.store.Append(ctx, subjects.Cluster(c.Name), c.Id, events.At(c.Revision), &clusterv1.ClusterAgentConnected{
		Id: c.Id, KubernetesVersion: hb.KubernetesVersion, AgentVersion: hb.AgentVersion, Time: timestamppb.New(seen), Hosted: hb.Hosted,
	})
	if events.IsConflict(err) {
		return 0, fmt.Errorf("cluster %s changed meanwhile: %w", c.Name, err) // retried on fresh state
	}
	if err != nil {
		return 0, err
	}
	s.log.Info("cluster agent connected", zap.String("cluster", c.Name), zap.String("kubernetes", hb.KubernetesVersion))
	return rev, nil
}

// recordResources appends ClusterResourcesReported when reported differs from what the view
// holds for c (at revision rev). A repeat of the same values appends nothing: the event log
// grows with changes, not with heartbeats.
func (s *Registry) recordResources(ctx context.Context, c *clusterv1.Cluster, rev uint64, reported *agentv1.ClusterResources, seen time.Time) error {
	res, err := normalizeResources(reported)
	if err != nil {
		// The heartbeat still counted for liveness; only its resources are ignored.
		s.log.Warn("ignoring resources an agent reported", zap.String("cluster", c.Name), zap.Error(err))
		return nil
	}
	cur := c.GetStatus().GetResources()
	if cur != nil && !seen.After(cur.GetReportTime().AsTime()) {
		return nil // the view holds a report at least as new
	}
	if cur != nil && cur.NodeCount == res.NodeCount && maps.Equal(cur.Allocatable, res.Allocatable) && maps.Equal(cur.Capacity, res.Capacity) {
		return nil
	}
	res.ReportTime = timestamppb.New(seen)
	_, err = s.store.Append(ctx, subjects.Cluster(c.Name), c.Id, events.At(rev), &clusterv1.ClusterResourcesReported{Id: c.Id, Resources: res})
	if events.IsConflict(err) {
		return fmt.Errorf("cluster %s changed meanwhile: %w", c.Name, err) // retried on fresh state
	}
	if err != nil {
		return fmt.Errorf("record resources of cluster %s: %w", c.Name, err)
	}
	s.log.Debug("cluster resources changed", zap.String("cluster", c.Name), zap.Int32("readyNodes", res.NodeCount))
	return nil
}

// normalizeResources checks what an agent sent (cpu and memory, valid non-negative quantities)
// and prints each quantity canonically, so equal amounts compare equal whatever notation an
// agent used.
func normalizeResources(r *agentv1.ClusterResources) (*clusterv1.ClusterResources, error) {
	if r.NodeCount < 0 {
		return nil, fmt.Errorf("node count %d", r.NodeCount)
	}
	out := &clusterv1.ClusterResources{NodeCount: r.NodeCount}
	var err error
	if out.Allocatable, err = normalizeQuantities("allocatable", r.Allocatable); err != nil {
		return nil, err
	}
	if out.Capacity, err = normalizeQuantities("capacity", r.Capacity); err != nil {
		return nil, err
	}
	return out, nil
}

func normalizeQuantities(field string, in map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(in))
	for name, v := range in {
		if name != "cpu" && name != "memory" {
			return nil, fmt.Errorf("%s: unexpected resource %s", field, apierr.Short(name))
		}
		if len(v) > maxQuantityLen {
			return nil, fmt.Errorf("%s[%s]: %d bytes, more than %d", field, name, len(v), maxQuantityLen)
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("%s[%s]: %s: %w", field, name, apierr.Short(v), err)
		}
		if q.Sign() < 0 {
			return nil, fmt.Errorf("%s[%s]: negative %s", field, name, q.String())
		}
		// One notation per resource (cpu in DecimalSI, memory in BinarySI): "30Gi" and
		// "32212254720" are the same memory and must compare equal.
		if name == "memory" {
			out[name] = resource.NewQuantity(q.Value(), resource.BinarySI).String()
		} else {
			out[name] = resource.NewMilliQuantity(q.MilliValue(), resource.DecimalSI).String()
		}
	}
	return out, nil
}

// recordHeartbeat stores st unless a newer heartbeat is stored already, and reports whether st
// is the newest (stored now, or by an earlier delivery of the same message): heartbeats are handled
// by several workers (and replicas), so an older one may finish last. The write is a
// compare-and-set against what was read, and a lost race is judged again on fresh state. Every
// lost race means another writer made progress, so the loop ends; it is bounded by ctx only
// (a fixed attempt count failed under 40 concurrent writers), with jitter to spread retries.
//
// The first attempt decides from this replica's cache of the bucket rather than a read: the
// compare-and-set catches a cache that is behind, and the read it saves was a third of the
// cost of each last-seen write on an idle hub (docs/scale.md).
//
// in_cluster_last_seen survives hosted heartbeats: it is the newest of the stored and the new.
func (s *Registry) recordHeartbeat(ctx context.Context, key string, st *clusterv1.AgentStatus) (newest bool, err error) {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return false, fmt.Errorf("record heartbeat of %s: %w", st.ClusterName, ctx.Err())
			case <-time.After(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 5)))):
			}
		}
		var old *clusterv1.AgentStatus
		var rev uint64
		if e, ok := s.status.GetEntry(key); ok && attempt == 0 {
			old, rev = e.Value, e.KVRevision
		} else {
			cur, err := s.statusKV.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
			case err != nil:
				return false, fmt.Errorf("read heartbeat of %s: %w", st.ClusterName, err)
			default:
				old, rev = &clusterv1.AgentStatus{}, cur.Revision()
				if proto.Unmarshal(cur.Value(), old) != nil {
					old = &clusterv1.AgentStatus{} // undecodable: overwritten
				}
			}
		}
		next := st
		if old != nil {
			if !old.LastSeen.AsTime().Before(st.LastSeen.AsTime()) {
				// A newer heartbeat, or this same one redelivered, is recorded already.
				return old.LastSeen.AsTime().Equal(st.LastSeen.AsTime()), nil
			}
			if old.InClusterLastSeen.AsTime().After(st.InClusterLastSeen.AsTime()) {
				next = proto.CloneOf(st)
				next.InClusterLastSeen = old.InClusterLastSeen
			}
		}
		data, err := proto.Marshal(next)
		if err != nil {
			return false, consumer.Permanent(err)
		}
		if old == nil {
			_, err = s.statusKV.Create(ctx, key, data)
		} else {
			_, err = s.statusKV.Update(ctx, key, data, rev)
		}
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return false, fmt.Errorf("record heartbeat of %s: %w", st.ClusterName, err)
		}
	}
}

// nothingNew reports whether a heartbeat says nothing the hub does not know but the time, and
// that time was recorded recently enough: then it is neither written nor acted on. Its
// resources equal the cluster's (or it has none), no field was dropped, and the stored status
// is recentEnough.
func (s *Registry) nothingNew(key, name string, st *clusterv1.AgentStatus, hb *agentv1.Heartbeat, problems []string) bool {
	if len(problems) > 0 || !s.recentEnough(key, st) {
		return false
	}
	if hb.Resources == nil {
		return true
	}
	c, ok := s.clusters.Get(clusterKey(name))
	if !ok {
		return false
	}
	res, err := normalizeResources(hb.Resources)
	cur := c.GetStatus().GetResources()
	return err == nil && cur != nil && cur.NodeCount == res.NodeCount && maps.Equal(cur.Allocatable, res.Allocatable) && maps.Equal(cur.Capacity, res.Capacity)
}

// recentEnough reports whether the stored status (as this replica's cache shows it) says all
// that st says but a last-seen time less than a third of UnreachableAfter older. Each write is a stored message, a read before it and a delivery to every cache of
// the bucket; writing every heartbeat made an idle fleet cost the hub a quarter of a core at
// 1,000 clusters (docs/scale.md). A healthy cluster's stored last-seen is then at most a third
// of UnreachableAfter plus one heartbeat old, well inside UnreachableAfter; what the API shows as
// last seen is as coarse. Anything else that changed (versions, session, hosted, resources) is
// written at once.
func (s *Registry) recentEnough(key string, st *clusterv1.AgentStatus) bool {
	cur, ok := s.status.Get(key)
	if !ok || cur.LastSeen == nil {
		return false
	}
	age := st.LastSeen.AsTime().Sub(cur.LastSeen.AsTime())
	if age < 0 || age >= s.cfg.UnreachableAfter/3 {
		return false
	}
	if st.InClusterLastSeen != nil && (cur.InClusterLastSeen == nil || st.InClusterLastSeen.AsTime().Sub(cur.InClusterLastSeen.AsTime()) >= s.cfg.UnreachableAfter/3) {
		return false
	}
	return cur.ClusterName == st.ClusterName && cur.KubernetesVersion == st.KubernetesVersion &&
		cur.AgentVersion == st.AgentVersion && cur.SessionId == st.SessionId && cur.Hosted == st.Hosted
}

// livenessLoop marks a cluster's agent lost (ClusterAgentLost: condition false, taint
// unreachable) once it has been silent for UnreachableAfter. It is a controller keyed by
// cluster (clusters view key): a change of the cluster (connected, lost, registered) or of its
// stored status (a heartbeat recorded) queues it, and a connected cluster not yet due is queued
// again at the moment it will be, its last heartbeat plus UnreachableAfter; nothing scans the
// fleet on a tick.
//
// Every replica runs it, without a lease, as before: the append expects the cluster's revision
// the decision was made on, so of replicas deciding alike one appends and the others find the
// cluster changed.
type livenessLoop struct {
	once sync.Once
	c    *reconcile.Controller
	// started is when this replica began to hear heartbeats (the registry ready): the
	// restart grace counts from it.
	started time.Time
}

// livenessResync is how often every connected cluster is looked at again whatever changed: a
// safety net only, since each is queued at its own deadline.
const livenessResync = time.Minute

// livenessController returns the liveness controller, built on first use (Mount registers its
// metrics before Run starts it).
func (s *Registry) livenessController() *reconcile.Controller {
	l := &s.liveness
	l.once.Do(func() {
		l.c = reconcile.New(reconcile.Config{Name: "cluster-import-liveness", Keys: s.connectedClusters, Resync: livenessResync,
			// A failed append is tried again at most CheckInterval later, as often as the
			// scan that came before it did, but sooner at first and without holding the others.
			MaxDelay: s.cfg.CheckInterval, Timeout: livenessTimeout, Log: s.log}, reconcile.Func(s.checkLiveness))
	})
	return l.c
}

// livenessTimeout bounds one cluster's check (its append, in a bus outage).
const livenessTimeout = 10 * time.Second

// runLiveness taints clusters whose agent went silent.
func (s *Registry) runLiveness(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	s.liveness.started = s.now()
	return s.livenessController().Run(ctx, reconcile.Watch(s.clusters, nil), reconcile.Watch(s.status, nil))
}

// connectedClusters are the keys of the clusters whose agent counts as connected: the only
// ones liveness may have to act on.
func (s *Registry) connectedClusters() []string {
	entries := s.clusters.Entries(func(_ string, c *clusterv1.Cluster) bool { return connected(c) })
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out
}

func connected(c *clusterv1.Cluster) bool {
	cond := Condition(c, ConditionAgentConnected)
	return cond != nil && cond.Status == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE
}

// checkLiveness marks the cluster at key lost if its agent has been silent for
// UnreachableAfter, or queues it again for when it will have been.
//
// Silent since the newest of its last heartbeat and the moment this replica started to hear
// heartbeats: heartbeats are not stored, so those sent while no replica ran are lost, and a
// cluster whose agent kept beating must not be marked lost after a restart for want of them
// (Kubernetes' node lifecycle controller likewise gives every node its grace period from its
// own start). A cluster whose agent went silent before the restart is marked lost
// UnreachableAfter after it, with its true last-seen time.
func (s *Registry) checkLiveness(ctx context.Context, key string) error {
	c, ok := s.clusters.Get(key)
	if !ok || !connected(c) {
		return nil // never connected, already marked lost, or gone
	}
	lastSeen := Condition(c, ConditionAgentConnected).LastTransitionTime.AsTime()
	if st, ok := s.status.Get(key); ok && st.LastSeen.AsTime().After(lastSeen) {
		lastSeen = st.LastSeen.AsTime()
	}
	due := lastSeen
	if s.liveness.started.After(due) {
		due = s.liveness.started
	}
	due = due.Add(s.cfg.UnreachableAfter)
	now := s.now()
	if now.Before(due) {
		s.livenessController().AddAfter(key, due.Sub(now))
		return nil
	}
	_, err := s.store.Append(ctx, subjects.Cluster(c.Name), c.Id, events.At(c.Revision), &clusterv1.ClusterAgentLost{
		Id: c.Id, LastSeen: timestamppb.New(lastSeen), Time: timestamppb.New(now),
	})
	switch {
	case events.IsConflict(err):
		// Changed meanwhile (a heartbeat, another replica's mark): the change queues the
		// cluster again through the clusters cache, and it is judged then.
		return nil
	case err != nil:
		return fmt.Errorf("mark cluster %s unreachable: %w", c.Name, err)
	}
	s.log.Warn("cluster agent lost", zap.String("cluster", c.Name), zap.Time("lastSeen", lastSeen))
	return nil
}

// validHeartbeats remembers, per cluster, the fields of its last heartbeat that checkHeartbeat
// found valid: an agent repeats the same versions, session and resources in every heartbeat,
// and checking them again (a semantic version and two quantities parsed) was a tenth of an idle
// hub's CPU at 1,000 clusters (docs/scale.md).
type validHeartbeats struct {
	m sync.Map // subject token -> *agentv1.Heartbeat (Time unset)
}

func (v *validHeartbeats) sameAs(tok string, hb *agentv1.Heartbeat) bool {
	e, ok := v.m.Load(tok)
	if !ok {
		return false
	}
	p := e.(*agentv1.Heartbeat)
	return p.KubernetesVersion == hb.KubernetesVersion && p.AgentVersion == hb.AgentVersion &&
		p.SessionId == hb.SessionId && sameResources(p.Resources, hb.Resources)
}

func (v *validHeartbeats) remember(tok string, hb *agentv1.Heartbeat) {
	v.m.Store(tok, &agentv1.Heartbeat{KubernetesVersion: hb.KubernetesVersion, AgentVersion: hb.AgentVersion,
		SessionId: hb.SessionId, Resources: hb.Resources})
}

func sameResources(a, b *agentv1.ClusterResources) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.NodeCount == b.NodeCount && maps.Equal(a.Allocatable, b.Allocatable) && maps.Equal(a.Capacity, b.Capacity)
}
