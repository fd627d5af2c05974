package clusterimport

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/topology"
)

// Subscribers are downstream systems' NATS identities. Bucket `subscribers` (name → record with
// the token's digest) is the truth and `subscriber-tokens` (digest → name) its index; both must
// agree for a token to admit anyone, so a half-done create or delete admits nobody. The events
// on FLEET_CLUSTER record who created and deleted which subscriber (never the token).

func subscribersTopology() topology.Topology {
	return topology.Topology{Buckets: []jetstream.KeyValueConfig{
		bucketConfig(natsauth.SubscribersBucket, "Downstream subscribers by name, with their token digest."),
		bucketConfig(natsauth.SubscriberTokensBucket, "Subscriber name by token digest."),
	}}
}

// subscriberSubject is where a subscriber's events go: under the cluster prefix, one token
// deeper than any cluster's subject, which the clusters projection skips.
func subscriberSubject(name string) string {
	return subjects.ClusterPrefix + ".subscriber." + keys.Encode(name)
}

// subscriberStore is the subscribers' two buckets.
type subscriberStore struct {
	records jetstream.KeyValue
	tokens  jetstream.KeyValue
}

func openSubscribers(ctx context.Context, js jetstream.JetStream) (subscriberStore, error) {
	var st subscriberStore
	var err error
	if st.records, err = js.KeyValue(ctx, natsauth.SubscribersBucket); err != nil {
		return st, fmt.Errorf("bucket %s: %w", natsauth.SubscribersBucket, err)
	}
	if st.tokens, err = js.KeyValue(ctx, natsauth.SubscriberTokensBucket); err != nil {
		return st, fmt.Errorf("bucket %s: %w", natsauth.SubscriberTokensBucket, err)
	}
	return st, nil
}

// SubscriberAPI implements clusterv1connect.SubscriberServiceHandler.
type SubscriberAPI struct {
	clusterv1connect.UnimplementedSubscriberServiceHandler
	s *Registry
}

// Subscribers returns the SubscriberService handler (mounted by Mount).
func (s *Registry) Subscribers() *SubscriberAPI { return &SubscriberAPI{s: s} }

func (a *SubscriberAPI) CreateSubscriber(ctx context.Context, req *connect.Request[clusterv1.CreateSubscriberRequest]) (*connect.Response[clusterv1.CreateSubscriberResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	if len(m.Streams) == 0 {
		v.Add("streams", "name at least one of %s", strings.Join(natsauth.SubscriberStreams(), ", "))
	}
	for i, st := range m.Streams {
		switch {
		case !slices.Contains(natsauth.SubscriberStreams(), st):
			v.Add(fmt.Sprintf("streams[%d]", i), "%q is not an event stream a subscriber may read (%s)", truncate(st, 40), strings.Join(natsauth.SubscriberStreams(), ", "))
		case slices.Contains(m.Streams[:i], st):
			v.Add(fmt.Sprintf("streams[%d]", i), "%s is named twice", st)
		}
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	s := a.s
	streams := slices.Sorted(slices.Values(m.Streams))
	sub := &clusterv1.Subscriber{
		Name: m.Name, Streams: streams, Consumers: map[string]string{},
		InboxPrefix: natsauth.SubscriberInboxPrefix(m.Name), CreateTime: timestamppb.New(s.now()),
	}
	for _, st := range streams {
		sub.Consumers[st] = natsauth.SubscriberConsumer(m.Name, st)
	}
	if m.DryRun {
		// The subscriber as it would be, and no token: nothing is handed out.
		switch _, _, err := s.subscriberRecord(ctx, m.Name); {
		case err == nil:
			return nil, apierr.AlreadyExists("subscriber", m.Name)
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return nil, apierr.Internal(err)
		}
		return connect.NewResponse(&clusterv1.CreateSubscriberResponse{Subscriber: sub}), nil
	}
	token, digest, err := newToken("fss_")
	if err != nil {
		return nil, apierr.Internal(err)
	}
	data, err := proto.Marshal(&clusterv1.SubscriberRecord{Subscriber: sub, TokenSha256: digest})
	if err != nil {
		return nil, apierr.Internal(err)
	}
	// The index first: a token whose record never appears admits nobody.
	if _, err := s.subs.tokens.Put(ctx, digest, []byte(m.Name)); err != nil {
		return nil, apierr.Internal(fmt.Errorf("store token of subscriber %s: %w", m.Name, err))
	}
	if _, err := s.subs.records.Create(ctx, keys.Encode(m.Name), data); err != nil {
		s.purgeSubscriberToken(digest)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, apierr.AlreadyExists("subscriber", m.Name)
		}
		return nil, apierr.Internal(fmt.Errorf("store subscriber %s: %w", m.Name, err))
	}
	// No events.Command: the record's KV Create above is the check (AlreadyExists); the event records what it let through.
	if _, err := s.store.Append(ctx, subscriberSubject(m.Name), m.Name, events.Any, &clusterv1.SubscriberCreated{Name: m.Name, Streams: streams}); err != nil {
		// Unrecorded, so undone: a subscriber exists only with its event.
		s.dropSubscriber(m.Name, digest)
		return nil, apierr.Internal(fmt.Errorf("record subscriber %s: %w", m.Name, err))
	}
	s.log.Info("subscriber created", zap.String("subscriber", m.Name), zap.Strings("streams", streams), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&clusterv1.CreateSubscriberResponse{Subscriber: sub, Token: token}), nil
}

func (a *SubscriberAPI) DeleteSubscriber(ctx context.Context, req *connect.Request[clusterv1.DeleteSubscriberRequest]) (*connect.Response[clusterv1.DeleteSubscriberResponse], error) {
	var v apierr.Violations
	v.DNSLabel("name", req.Msg.Name)
	if err := v.Err(); err != nil {
		return nil, err
	}
	s, name := a.s, req.Msg.Name
	rec, rev, err := s.subscriberRecord(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, apierr.NotFound("subscriber", name)
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if req.Msg.DryRun {
		return connect.NewResponse(&clusterv1.DeleteSubscriberResponse{}), nil
	}
	// The record goes first: from then on the token admits nobody, whatever happens next.
	if err := s.subs.records.Purge(ctx, keys.Encode(name), jetstream.LastRevision(rev)); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, apierr.Aborted("subscriber %q changed while being deleted; retry", name)
		}
		return nil, apierr.Internal(fmt.Errorf("delete subscriber %s: %w", name, err))
	}
	s.purgeSubscriberToken(rec.TokenSha256)
	// No events.Command: the record's compare-and-delete above is the check; the event records it.
	if _, err := s.store.Append(ctx, subscriberSubject(name), name, events.Any, &clusterv1.SubscriberDeleted{Name: name}); err != nil {
		s.log.Warn("subscriber deleted but the event was not recorded", zap.String("subscriber", name), zap.Error(err))
	}
	s.log.Info("subscriber deleted", zap.String("subscriber", name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&clusterv1.DeleteSubscriberResponse{}), nil
}

func (a *SubscriberAPI) ListSubscribers(ctx context.Context, _ *connect.Request[clusterv1.ListSubscribersRequest]) (*connect.Response[clusterv1.ListSubscribersResponse], error) {
	s := a.s
	lister, err := s.subs.records.ListKeys(ctx)
	if err != nil {
		return nil, apierr.Internal(fmt.Errorf("list subscribers: %w", err))
	}
	defer func() { _ = lister.Stop() }()
	res := &clusterv1.ListSubscribersResponse{}
	for k := range lister.Keys() {
		name, err := keys.Decode(k)
		if err != nil {
			continue
		}
		rec, _, err := s.subscriberRecord(ctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted while listing
		}
		if err != nil {
			return nil, apierr.Internal(err)
		}
		res.Subscribers = append(res.Subscribers, rec.Subscriber)
	}
	slices.SortFunc(res.Subscribers, func(a, b *clusterv1.Subscriber) int { return strings.Compare(a.Name, b.Name) })
	return connect.NewResponse(res), nil
}

func (s *Registry) subscriberRecord(ctx context.Context, name string) (*clusterv1.SubscriberRecord, uint64, error) {
	e, err := s.subs.records.Get(ctx, keys.Encode(name))
	if err != nil {
		return nil, 0, fmt.Errorf("load subscriber %s: %w", name, err)
	}
	rec := &clusterv1.SubscriberRecord{}
	if err := proto.Unmarshal(e.Value(), rec); err != nil || rec.Subscriber == nil {
		return nil, 0, fmt.Errorf("decode subscriber %s: %v", name, err)
	}
	return rec, e.Revision(), nil
}

// SubscriberIdentity returns which subscriber a NATS token belongs to; a deleted subscriber's
// token is refused.
func (s *Registry) SubscriberIdentity(ctx context.Context, token string) (natsauth.Identity, bool) {
	sum := sha256.Sum256([]byte(token))
	digest := hex.EncodeToString(sum[:])
	e, err := s.subs.tokens.Get(ctx, digest)
	if err != nil {
		return natsauth.Identity{}, false
	}
	rec, _, err := s.subscriberRecord(ctx, string(e.Value()))
	if err != nil || subtle.ConstantTimeCompare([]byte(rec.TokenSha256), []byte(digest)) != 1 {
		return natsauth.Identity{}, false
	}
	return subscriberIdentity(rec), true
}

// subscriberIdentity is the NATS identity of a subscriber record: a subscriber created again
// under the same name has a new token, so a new instance (revoke.go).
func subscriberIdentity(rec *clusterv1.SubscriberRecord) natsauth.Identity {
	return natsauth.Identity{Kind: natsauth.KindSubscriber, Name: rec.Subscriber.Name, Streams: rec.Subscriber.Streams,
		Instance: tokenInstance(rec.TokenSha256)}
}

// tokenInstance names a token's instance by a prefix of its digest: enough to tell two tokens of
// one name apart, nothing to guess the token by.
func tokenInstance(digest string) string { return digest[:min(len(digest), 12)] }

// purgeSubscriberToken and dropSubscriber clean up best effort, detached from the caller's
// context (a cancelled request must not leave a half-made subscriber behind).
func (s *Registry) purgeSubscriberToken(digest string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.subs.tokens.Purge(ctx, digest); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Warn("drop subscriber token", zap.Error(err))
	}
}

func (s *Registry) dropSubscriber(name, digest string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.subs.records.Purge(ctx, keys.Encode(name)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Warn("drop subscriber", zap.String("subscriber", name), zap.Error(err))
	}
	s.purgeSubscriberToken(digest)
}

func newToken(prefix string) (token, digest string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("generate token: %w", err)
	}
	token = prefix + base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	return token, hex.EncodeToString(sum[:]), nil
}

// truncate keeps error messages short whatever the caller sent.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
