package clusterimport

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/view"
)

// Revocation of open NATS connections. A token stops admitting new connections the moment its
// cluster is deregistered or its subscriber deleted (the resolver reads the registry), but a
// connection admitted before keeps its permissions, and an agent's permissions are by cluster
// name: left open, a deregistered cluster's agent would go on publishing as that cluster and
// read the desired state of a cluster registered later under its name. So every replica watches
// its own view of the clusters and of the subscribers, and when an identity goes (deregistered,
// registered again under a new id, deleted, created again with a new token) it has the Kicker
// close that identity's connections on every NATS server (natsauth.Identity.User names the
// instance, so the new cluster's agent is never touched).
//
// Every replica kicks, not a lease holder: a kick is idempotent (no connection left, nothing to
// do), needs no coordination, and is not delayed by a lease changing hands. Each replica kicks
// once its own view has the change, which is also when its resolver starts refusing: a kicked
// client that reconnects through a replica whose view lags is kicked again when that replica's
// view catches up. A kick is repeated after rekickAfter for a connection that was being admitted
// while the first ran (its token resolved just before the change).

// rekickAfter is when a revocation's connections are closed a second time: longer than a
// connection takes from the resolver's answer to being registered by its server.
const rekickAfter = 3 * time.Second

// runRevocation watches for revoked identities until ctx ends. Without a Kicker, revoked
// connections last until their authorization expires.
func (s *Registry) runRevocation(ctx context.Context) error {
	if s.cfg.Kicker == nil {
		s.log.Warn("no NATS kicker configured: a revoked agent's or subscriber's open connection lasts until its authorization expires (--nats-callout-valid-for)")
		return nil
	}
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil
	}
	go s.watchRevokedSubscribers(ctx)
	s.watchRevokedClusters(ctx)
	return nil
}

// watchRevokedClusters kicks the agent of every cluster that leaves this replica's view or is
// replaced in it by a cluster of the same name and another id.
func (s *Registry) watchRevokedClusters(ctx context.Context) {
	known := map[string]natsauth.Identity{} // by view key
	for ctx.Err() == nil {
		snapshot, updates := s.clusters.Subscribe(ctx, 4096)
		// After falling behind, the snapshot tells what went meanwhile.
		now := map[string]natsauth.Identity{}
		for _, u := range snapshot {
			now[u.Key] = agentIdentity(u.Value)
		}
		for k, id := range known {
			if now[k].Instance != id.Instance {
				s.revoke(ctx, id)
			}
		}
		known = now
		for u := range updates {
			was, ok := known[u.Key]
			if u.Op != view.Put || u.Value.GetId() == "" {
				delete(known, u.Key)
			} else {
				known[u.Key] = agentIdentity(u.Value)
			}
			if ok && known[u.Key].Instance != was.Instance {
				s.revoke(ctx, was)
			}
		}
	}
}

func agentIdentity(c *clusterv1.Cluster) natsauth.Identity {
	return natsauth.Identity{Kind: natsauth.KindAgent, Name: c.GetName(), Instance: c.GetId()}
}

// watchRevokedSubscribers kicks every subscriber deleted, or created again with a new token.
func (s *Registry) watchRevokedSubscribers(ctx context.Context) {
	known := map[string]natsauth.Identity{} // by bucket key
	for ctx.Err() == nil {
		w, err := s.subs.records.WatchAll(ctx)
		if err != nil {
			s.log.Warn("watch subscribers for revocation", zap.Error(err))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
				continue
			}
		}
		now, initial := map[string]natsauth.Identity{}, true
		for e := range w.Updates() {
			if e == nil { // the current entries are in: what went while not watching goes now
				initial = false
				for k, id := range known {
					if now[k].Instance != id.Instance {
						s.revoke(ctx, id)
					}
				}
				known = now
				continue
			}
			cur, ok := natsauth.Identity{}, false
			if e.Operation() == jetstream.KeyValuePut {
				rec := &clusterv1.SubscriberRecord{}
				if proto.Unmarshal(e.Value(), rec) == nil && rec.Subscriber != nil {
					cur, ok = subscriberIdentity(rec), true
				}
			}
			if initial {
				if ok {
					now[e.Key()] = cur
				}
				continue
			}
			was, had := known[e.Key()]
			if ok {
				known[e.Key()] = cur
			} else {
				delete(known, e.Key())
			}
			if had && cur.Instance != was.Instance {
				s.revoke(ctx, was)
			}
		}
		_ = w.Stop()
	}
}

// revoke closes id's connections now and once more after rekickAfter, in the background.
func (s *Registry) revoke(ctx context.Context, id natsauth.Identity) {
	if id.Name == "" || id.Instance == "" {
		return
	}
	user := id.User()
	go func() {
		for i := 0; i < 2; i++ {
			if i > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(rekickAfter):
				}
			}
			kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			n, err := s.cfg.Kicker.Kick(kctx, user)
			cancel()
			switch {
			case err != nil && !errors.Is(err, context.Canceled):
				s.log.Warn("close revoked NATS connections", zap.String("user", user), zap.Int("closed", n), zap.Error(err))
			case n > 0:
				s.log.Info("closed revoked NATS connections", zap.String("user", user), zap.Int("closed", n))
			}
		}
	}()
}
