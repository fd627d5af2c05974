package clusterimport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/consumer"
	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// runHeartbeats records each agent heartbeat in bucket cluster-status and marks a cluster
// connected when heartbeats (re)appear. Only the latest heartbeat per cluster matters, so after
// a restart the consumer starts from the last one of each.
func (s *Service) runHeartbeats(ctx context.Context) error {
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
		Workers:        4,
	}, s.log, s.handleHeartbeat)
}

func (s *Service) handleHeartbeat(ctx context.Context, m jetstream.Msg) error {
	ev, err := events.DecodeMsg(m)
	if err != nil {
		return consumer.Permanent(err)
	}
	hb, ok := ev.Payload.(*agentv1.Heartbeat)
	if !ok {
		return consumer.Permanent(fmt.Errorf("unexpected %s on %s", ev.Type, m.Subject()))
	}
	tok, err := subjectToken(m.Subject(), 2)
	if err != nil {
		return consumer.Permanent(err)
	}
	name, err := keys.Decode(tok)
	if err != nil {
		return consumer.Permanent(err)
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
	if err := s.recordHeartbeat(ctx, tok, &clusterv1.AgentStatus{ClusterName: name, KubernetesVersion: hb.KubernetesVersion,
		AgentVersion: hb.AgentVersion, SessionId: hb.SessionId, LastSeen: timestamppb.New(seen)}); err != nil {
		return err
	}
	c, ok := s.clusters.Get(clusterKey(name))
	if !ok {
		return nil // an agent of a cluster not (or no longer) registered
	}
	if cond := Condition(c, ConditionAgentConnected); cond != nil && cond.Status == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE &&
		c.Status.KubernetesVersion == hb.KubernetesVersion {
		return nil
	}
	_, err = s.store.Append(ctx, subjects.Cluster(name), c.Id, events.At(c.Revision), &clusterv1.ClusterAgentConnected{
		Id: c.Id, KubernetesVersion: hb.KubernetesVersion, AgentVersion: hb.AgentVersion, Time: timestamppb.New(seen),
	})
	if events.IsConflict(err) {
		return fmt.Errorf("cluster %s changed meanwhile: %w", name, err) // retried on fresh state
	}
	if err == nil {
		s.log.Info("cluster agent connected", zap.String("cluster", name), zap.String("kubernetes", hb.KubernetesVersion))
	}
	return err
}

// recordHeartbeat stores st unless a newer heartbeat is stored already: heartbeats are handled
// by several workers (and replicas), so an older one may finish last. The write is a
// compare-and-set against what was read, and a lost race is judged again on fresh state. Every
// lost race means another writer made progress, so the loop ends; it is bounded by ctx only
// (a fixed attempt count failed under 40 concurrent writers), with jitter to spread retries.
func (s *Service) recordHeartbeat(ctx context.Context, key string, st *clusterv1.AgentStatus) error {
	data, err := proto.Marshal(st)
	if err != nil {
		return consumer.Permanent(err)
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("record heartbeat of %s: %w", st.ClusterName, ctx.Err())
			case <-time.After(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 5)))):
			}
		}
		cur, err := s.statusKV.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = s.statusKV.Create(ctx, key, data)
		case err != nil:
			return fmt.Errorf("read heartbeat of %s: %w", st.ClusterName, err)
		default:
			old := &clusterv1.AgentStatus{}
			if proto.Unmarshal(cur.Value(), old) == nil && !old.LastSeen.AsTime().Before(st.LastSeen.AsTime()) {
				return nil // a newer (or this same) heartbeat is already recorded
			}
			_, err = s.statusKV.Update(ctx, key, data, cur.Revision())
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("record heartbeat of %s: %w", st.ClusterName, err)
		}
	}
}

// runLiveness taints clusters whose agent went silent.
func (s *Service) runLiveness(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	t := time.NewTicker(s.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.checkLiveness(ctx)
		}
	}
}

func (s *Service) checkLiveness(ctx context.Context) {
	now := s.now()
	for _, c := range s.clusters.List(nil) {
		cond := Condition(c, ConditionAgentConnected)
		if cond == nil || cond.Status != clusterv1.ConditionStatus_CONDITION_STATUS_TRUE {
			continue // never connected or already marked lost
		}
		lastSeen := cond.LastTransitionTime.AsTime()
		if st, ok := s.status.Get(clusterKey(c.Name)); ok && st.LastSeen.AsTime().After(lastSeen) {
			lastSeen = st.LastSeen.AsTime()
		}
		if now.Sub(lastSeen) < s.cfg.UnreachableAfter {
			continue
		}
		_, err := s.store.Append(ctx, subjects.Cluster(c.Name), c.Id, events.At(c.Revision), &clusterv1.ClusterAgentLost{
			Id: c.Id, LastSeen: timestamppb.New(lastSeen), Time: timestamppb.New(now),
		})
		switch {
		case err == nil:
			s.log.Warn("cluster agent lost", zap.String("cluster", c.Name), zap.Time("lastSeen", lastSeen))
		case events.IsConflict(err):
			// Changed meanwhile (maybe a heartbeat): judged again on the next tick.
		default:
			s.log.Error("mark cluster unreachable", zap.String("cluster", c.Name), zap.Error(err))
		}
	}
}
