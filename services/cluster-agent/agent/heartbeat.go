package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/version"

	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// versionTimeout bounds the Kubernetes version lookup so a slow apiserver delays a heartbeat by
// at most this much: the heartbeat says the agent is alive, whatever the apiserver does.
const versionTimeout = 3 * time.Second

// heartbeatRetry is how soon a heartbeat that could not be published is tried again.
const heartbeatRetry = time.Second

// heartbeater publishes a Heartbeat at once, then every HeartbeatInterval, whenever the
// Ready nodes' resources change and whenever the NATS connection is back: a hub that marked
// the cluster lost during an outage learns it is back at once, not up to an interval later. A
// failed publish is retried after heartbeatRetry (or the interval, if shorter) with a fresh
// heartbeat, never queued: a stale heartbeat is worthless. The retry matters because the
// connected event is not proof of a connection: nats.go reports CONNECTED before it flushes
// what it buffered, and goes back to reconnecting when that flush fails.
type heartbeater struct {
	agent     *Agent
	resources *nodeResources
	// kubeVersion is the last version the apiserver told us, sent when it cannot be asked.
	kubeVersion string
	failing     bool
}

func (h *heartbeater) Run(ctx context.Context) error {
	t := time.NewTicker(h.agent.cfg.HeartbeatInterval)
	defer t.Stop()
	nc := h.agent.js.Conn()
	reconnected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(reconnected)
	var retry <-chan time.Time
	for {
		retry = nil
		if !h.beat(ctx) {
			retry = time.After(min(heartbeatRetry, h.agent.cfg.HeartbeatInterval))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-retry:
		case <-t.C:
		case <-h.resources.Changed():
			// The hub learns of the change now; the next periodic beat is a full interval on.
			t.Reset(h.agent.cfg.HeartbeatInterval)
		case <-reconnected:
			t.Reset(h.agent.cfg.HeartbeatInterval)
		}
	}
}

// beat publishes one heartbeat; false when it should be tried again.
func (h *heartbeater) beat(ctx context.Context) bool {
	a := h.agent
	if nc := a.js.Conn(); !nc.IsConnected() {
		// Checked before asking the apiserver, so that retrying through an outage costs nothing.
		return h.published(ctx, fmt.Errorf("publish heartbeat: nats connection %s", nc.Status()))
	}
	v, err := h.serverVersion(ctx)
	switch {
	case ctx.Err() != nil:
		return true // shutting down
	case err != nil && a.cfg.Hosted:
		a.log.Warn("kubernetes apiserver unreachable; no heartbeat", zap.Error(err))
		return true // the apiserver is what is down: the next tick asks it again
	case err != nil:
		a.log.Warn("kubernetes version unavailable; sending the last known", zap.Error(err))
	default:
		h.kubeVersion = v
	}
	hb := &agentv1.Heartbeat{
		ClusterName:       a.cfg.ClusterName,
		AgentVersion:      a.cfg.AgentVersion,
		KubernetesVersion: h.kubeVersion,
		Time:              timestamppb.Now(),
		SessionId:         a.sessionID,
		Resources:         h.resources.Current(),
		Hosted:            a.cfg.Hosted,
	}
	return h.published(ctx, a.publishHeartbeat(hb))
}

// published logs the outcome of a publish (an outage once, not at every retry) and reports
// whether the heartbeat is done with.
func (h *heartbeater) published(ctx context.Context, err error) bool {
	a := h.agent
	switch {
	case err != nil && ctx.Err() != nil:
		// Shutting down.
	case err != nil && !h.failing:
		h.failing = true
		a.log.Warn("heartbeat not published; retrying", zap.Error(err))
	case err != nil:
		// Logged once when the outage began; every tick would flood the log.
		a.log.Debug("heartbeat not published", zap.Error(err))
	case h.failing:
		h.failing = false
		a.log.Info("heartbeat published again")
	}
	return err == nil || ctx.Err() != nil
}

// serverVersion asks /version with a deadline; the discovery client's ServerVersion takes no
// context and could hang a heartbeat on a stuck connection.
func (h *heartbeater) serverVersion(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	raw, err := h.agent.kube.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return "", fmt.Errorf("get /version: %w", err)
	}
	var info version.Info
	if err := json.Unmarshal(raw, &info); err != nil {
		return "", fmt.Errorf("decode /version: %w", err)
	}
	return info.GitVersion, nil
}

// publishHeartbeat sends hb on core NATS (subjects.LivePrefix): not stored, so there is no ack
// to wait for, and one lost is made good by the next. Disconnected, it fails rather than queue
// in the reconnect buffer: a heartbeat is about now, not about when the connection comes back.
func (a *Agent) publishHeartbeat(hb *agentv1.Heartbeat) error {
	nc := a.js.Conn()
	if !nc.IsConnected() {
		return fmt.Errorf("publish heartbeat: nats connection %s", nc.Status())
	}
	data, err := proto.Marshal(hb)
	if err != nil {
		return fmt.Errorf("publish heartbeat: %w", err)
	}
	if err := nc.Publish(subjects.AgentLiveHeartbeat(a.cfg.ClusterName), data); err != nil {
		return fmt.Errorf("publish heartbeat: %w", err)
	}
	return nil
}
