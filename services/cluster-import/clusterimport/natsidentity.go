package clusterimport

import (
	"context"
	"strings"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
)

// NATSResolver resolves every token that may connect to NATS: the hub services' tokens
// (serviceTokens, nil for none: fleetd's services share its in-process connection), agent tokens
// of registered clusters and subscriber tokens. It answers fleetd's embedded server and the
// auth callout alike, so both grant from the one table in pkg/natsauth.
func (s *Registry) NATSResolver(serviceTokens *natsauth.ServiceTokens) natsauth.Resolver {
	return func(ctx context.Context, user, token string) (natsauth.Identity, bool) {
		if svc, ok := serviceTokens.Lookup(token); ok {
			return natsauth.ResolveHostedAgent(natsauth.Identity{Kind: natsauth.KindService, Name: svc}, user, func(cluster string) (string, bool) {
				// The registry is read only once the service caught up.
				select {
				case <-s.ready:
				default:
					return "", false
				}
				c, ok := s.clusters.Get(clusterKey(cluster))
				if !ok {
					return "", false
				}
				return c.Id, true
			})
		}
		if natsauth.IsHostedAgentUser(user) {
			return natsauth.Identity{}, false // only the hosted-agent service's token may
		}
		// Agents and subscribers are known from the registry and the subscriber buckets, which
		// are only read once the service caught up (and the caches exist).
		select {
		case <-s.ready:
		default:
			return natsauth.Identity{}, false
		}
		switch {
		case strings.HasPrefix(token, "fss_"):
			return s.SubscriberIdentity(ctx, token)
		default:
			id, ok := s.AgentIdentity(ctx, token)
			if !ok {
				return natsauth.Identity{}, false
			}
			return natsauth.Identity{Kind: natsauth.KindAgent, Name: id.ClusterName, Instance: id.ClusterId}, true
		}
	}
}
