package clusterimport

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// hostedQueue is the queue group of every replica's credential responder: one answers.
const hostedQueue = "cluster-import-hosted-credentials"

// runHostedCredentials answers hub-hosted agents' requests for a cluster's connection
// credentials (subjects.HostedCredentials), opened from the sealed store. Only the hosted-agent
// service may publish there (pkg/natsauth), and the reply goes to its own inbox prefix; the
// credentials travel like the Secrets agents report for import policies and are never stored
// or logged on the way. It subscribes once the registry is read, so no replica answers "not
// registered" while catching up.
func (s *Registry) runHostedCredentials(ctx context.Context, nc *nats.Conn) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	sub, err := nc.QueueSubscribe(subjects.HostedCredentialsPrefix+".*", hostedQueue, func(m *nats.Msg) {
		resp := s.hostedCredentials(ctx, m.Data)
		data, err := proto.Marshal(resp)
		if err == nil {
			err = m.Respond(data)
		}
		if err != nil {
			s.log.Warn("answer hosted agent's credentials request", zap.String("cluster", resp.ClusterName), zap.Error(err))
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe to hosted agents' credential requests: %w", err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
	return nil
}

func (s *Registry) hostedCredentials(ctx context.Context, data []byte) *clusterv1.HostedAgentCredentialsResponse {
	req := &clusterv1.HostedAgentCredentialsRequest{}
	if err := proto.Unmarshal(data, req); err != nil || req.ClusterName == "" {
		return &clusterv1.HostedAgentCredentialsResponse{Error: "malformed request"}
	}
	resp := &clusterv1.HostedAgentCredentialsResponse{ClusterName: req.ClusterName}
	c, ok := s.clusters.Get(clusterKey(req.ClusterName))
	if !ok {
		resp.Error = fmt.Sprintf("cluster %s is not registered", req.ClusterName)
		return resp
	}
	sec, err := s.getSecrets(ctx, c.Id)
	if err != nil {
		// The error names the cluster and a key id, never a value.
		s.log.Warn("hosted agent's credentials", zap.String("cluster", c.Name), zap.Error(err))
		resp.Error = fmt.Sprintf("credentials of cluster %s cannot be read", c.Name)
		return resp
	}
	if sec.Credentials == nil {
		resp.Error = fmt.Sprintf("cluster %s has no credentials", c.Name)
		return resp
	}
	resp.ClusterId = c.Id
	resp.Credentials = sec.Credentials
	resp.CredentialsFingerprint = fingerprint(sec.Credentials)
	return resp
}
