package clusterimport

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/nsinventory"
	"github.com/fleetstream/fleetstream/pkg/paging"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

func (s *Registry) RegisterCluster(ctx context.Context, req *connect.Request[clusterv1.RegisterClusterRequest]) (*connect.Response[clusterv1.RegisterClusterResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	validateMeta(&v, m.Labels, m.Claims, m.Taints)
	validateCredentials(&v, "credentials", m.Credentials, s.cfg.Credentials)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if m.DryRun {
		c, err := s.registerDryRun(ctx, m)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(&clusterv1.RegisterClusterResponse{Cluster: c}), nil
	}
	c, token, err := s.registerWithToken(ctx, m, nil)
	if err != nil {
		return nil, err
	}
	s.log.Info("cluster registered", zap.String("cluster", m.Name), zap.String("id", c.Id), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&clusterv1.RegisterClusterResponse{Cluster: c, AgentToken: token}), nil
}

// register registers a validated cluster for an import lifecycle: the same events as
// RegisterCluster, with the origin in ClusterRegistered and a ClusterImported after it.
func (s *Registry) register(ctx context.Context, m *clusterv1.RegisterClusterRequest, origin *clusterv1.ImportOrigin) (*clusterv1.Cluster, error) {
	c, _, err := s.registerWithToken(ctx, m, origin)
	return c, err
}

// registerDryRun refuses what registerWithToken would refuse and answers the cluster as the
// registration would make it (no id, no token: nothing is handed out).
func (s *Registry) registerDryRun(ctx context.Context, m *clusterv1.RegisterClusterRequest) (*clusterv1.Cluster, error) {
	if _, ok := s.clusters.Get(clusterKey(m.Name)); ok {
		return nil, apierr.AlreadyExists("cluster", m.Name)
	}
	_, prev, err := events.Last(ctx, s.stream, subjects.Cluster(m.Name))
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if prev != nil {
		if _, gone := prev.Payload.(*clusterv1.ClusterDeregistered); !gone {
			return nil, apierr.AlreadyExists("cluster", m.Name)
		}
	}
	return foldCluster(m.Name, nil, []proto.Message{&clusterv1.ClusterRegistered{
		Name: m.Name, Labels: m.Labels, Claims: m.Claims, Taints: stampTaints(m.Taints, nil), CredentialsFingerprint: fingerprint(m.Credentials),
	}}), nil
}

// foldCluster applies evs to cur (nil: absent) with the view's own code: a dry run's answer.
func foldCluster(name string, cur *clusterv1.Cluster, evs []proto.Message) *clusterv1.Cluster {
	var state proto.Message
	if cur != nil {
		state = proto.CloneOf(cur)
	}
	now := timestamppb.Now()
	for _, ev := range evs {
		changes, err := applyCluster(&events.Event{Envelope: &eventv1.Envelope{Time: now}, Subject: subjects.Cluster(name), Payload: ev})
		if err != nil || len(changes) != 1 {
			continue
		}
		state = changes[0].Update(state)
	}
	c, _ := state.(*clusterv1.Cluster)
	return c
}

func (s *Registry) registerWithToken(ctx context.Context, m *clusterv1.RegisterClusterRequest, origin *clusterv1.ImportOrigin) (*clusterv1.Cluster, string, error) {
	if _, ok := s.clusters.Get(clusterKey(m.Name)); ok {
		return nil, "", apierr.AlreadyExists("cluster", m.Name)
	}
	id := uuid.NewString()
	token, digest, err := newAgentToken()
	if err != nil {
		return nil, "", apierr.Internal(err)
	}
	secrets := &clusterv1.ClusterSecrets{ClusterId: id, ClusterName: m.Name, Credentials: m.Credentials, AgentTokenSha256: digest}
	if origin != nil && m.Credentials != nil {
		secrets.CredentialsImportOrigin = origin
	}
	// stored: the secrets were written; registered: the registration was appended (the
	// import's announcement after it is about to be).
	var stored, registered bool
	res, err := events.Command[*events.Event]{
		Store: s.store, Subject: subjects.Cluster(m.Name), AggregateID: id, MaxConflicts: -1,
		// A name may be reused after deregistration: expect the subject exactly as it is now,
		// so that of two concurrent registrations only one appends (the other answers
		// AlreadyExists). The view may not show a registration appended a moment ago, so the
		// subject itself must end in a deregistration.
		Load: func(ctx context.Context, _ uint64) (*events.Event, uint64, error) {
			seq, last, err := events.Last(ctx, s.stream, subjects.Cluster(m.Name))
			return last, seq, err
		},
		Decide: func(last *events.Event) ([]proto.Message, error) {
			if _, gone := events.PayloadOf(last).(*clusterv1.ClusterDeregistered); last != nil && !gone {
				return nil, apierr.AlreadyExists("cluster", m.Name)
			}
			evs := []proto.Message{&clusterv1.ClusterRegistered{
				Id: id, Name: m.Name, Labels: m.Labels, Claims: m.Claims, Taints: stampTaints(m.Taints, nil),
				CredentialsFingerprint: fingerprint(m.Credentials), ImportedBy: origin,
			}}
			if origin != nil {
				// Downstream subscribers learn of imports here; the view already knows from
				// the registration, so a crash before this append loses only the announcement.
				evs = append(evs, &clusterv1.ClusterImported{Id: id, Name: m.Name, Origin: origin})
			}
			return evs, nil
		},
		BeforeAppend: func(ctx context.Context, _ *events.Event, ev proto.Message) error {
			switch ev.(type) {
			case *clusterv1.ClusterRegistered:
				// Secrets go first, keyed by the fresh id: if the append then fails they are
				// unreachable garbage, never a registered cluster missing its credentials.
				stored = true
				return s.putSecrets(ctx, secrets)
			case *clusterv1.ClusterImported:
				registered = true
			}
			return nil
		},
	}.Run(ctx)
	if err != nil {
		if stored && !registered {
			s.dropSecrets(secrets)
			if events.IsConflict(err) {
				return nil, "", apierr.AlreadyExists("cluster", m.Name)
			}
		}
		return nil, "", apierr.Internal(err)
	}
	seq := res.Sequence
	c, err := s.awaitCluster(ctx, m.Name, seq)
	if err != nil {
		return nil, "", err
	}
	return c, token, nil
}

func (s *Registry) UpdateCluster(ctx context.Context, req *connect.Request[clusterv1.UpdateClusterRequest]) (*connect.Response[clusterv1.UpdateClusterResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	fields := m.GetUpdateMask().GetPaths()
	if len(fields) == 0 {
		v.Add("update_mask", "name at least one of labels, claims, taints, credentials")
	}
	for i, f := range fields {
		if !slices.Contains([]string{"labels", "claims", "taints", "credentials"}, f) {
			v.Add(fmt.Sprintf("update_mask.paths[%d]", i), "%q cannot be updated (labels, claims, taints, credentials)", f)
		}
	}
	validateMeta(&v, m.Labels, m.Claims, m.Taints)
	if slices.Contains(fields, "credentials") {
		validateCredentials(&v, "credentials", m.Credentials, s.cfg.Credentials)
	}
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	// Without an expected revision the caller wants "last writer wins": a lost race is decided
	// again on fresh state. With one, a lost race is the caller's to resolve.
	cmd := s.updateCommand(m, fields, nil, s.clusterKind().Load(m.Name, m.ExpectedRevision))
	cmd.Expected, cmd.DryRun = m.ExpectedRevision, m.DryRun
	res, err := cmd.Run(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if m.DryRun {
		return connect.NewResponse(&clusterv1.UpdateClusterResponse{Cluster: s.present(ctx, foldCluster(m.Name, res.State, res.Events))}), nil
	}
	c, err := s.awaitCluster(ctx, m.Name, lastSeq(res))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&clusterv1.UpdateClusterResponse{Cluster: c}), nil
}

// update appends the events of an update to cur, and only to cur: a lost race is the caller's.
// Credentials it writes are recorded as origin's (an import lifecycle's), or as an admin's when
// origin is nil.
func (s *Registry) update(ctx context.Context, cur *clusterv1.Cluster, m *clusterv1.UpdateClusterRequest, fields []string, origin *clusterv1.ImportOrigin) (uint64, error) {
	cmd := s.updateCommand(m, fields, origin, func(context.Context, uint64) (*clusterv1.Cluster, uint64, error) {
		return cur, cur.Revision, nil
	})
	cmd.Subject, cmd.Expected = subjects.Cluster(cur.Name), cur.Revision
	res, err := cmd.Run(ctx)
	if err != nil {
		return 0, err
	}
	return lastSeq(res), nil
}

// lastSeq is the sequence a write's caller waits for: its last event's, or the revision it
// decided from when it appended nothing.
func lastSeq[S any](res events.Result[S]) uint64 {
	if len(res.Events) == 0 {
		return res.Revision
	}
	return res.Sequence
}

// updateCommand is the command of an update of the cluster m names, the cluster loaded by load.
func (s *Registry) updateCommand(m *clusterv1.UpdateClusterRequest, fields []string, origin *clusterv1.ImportOrigin, load func(context.Context, uint64) (*clusterv1.Cluster, uint64, error)) events.Command[*clusterv1.Cluster] {
	return events.Command[*clusterv1.Cluster]{
		Store: s.store, Subject: subjects.Cluster(m.Name), AggregateIDOf: (*clusterv1.Cluster).GetId,
		Load:   load,
		Decide: func(cur *clusterv1.Cluster) ([]proto.Message, error) { return decideUpdate(cur, m, fields), nil },
		BeforeAppend: func(ctx context.Context, cur *clusterv1.Cluster, ev proto.Message) error {
			if _, ok := ev.(*clusterv1.ClusterCredentialsRotated); ok {
				return s.replaceCredentials(ctx, cur.Id, m.Credentials, origin)
			}
			return nil
		},
	}
}

// decideUpdate returns the events of update m of fields to cur.
func decideUpdate(cur *clusterv1.Cluster, m *clusterv1.UpdateClusterRequest, fields []string) []proto.Message {
	var evs []proto.Message
	var metaFields []string
	for _, f := range fields {
		if f != "credentials" {
			metaFields = append(metaFields, f)
		}
	}
	if len(metaFields) > 0 {
		evs = append(evs, &clusterv1.ClusterUpdated{
			Id: cur.Id, Fields: metaFields, Labels: m.Labels, Claims: m.Claims, Taints: stampTaints(m.Taints, cur.Taints),
		})
	}
	if slices.Contains(fields, "credentials") {
		evs = append(evs, &clusterv1.ClusterCredentialsRotated{Id: cur.Id, CredentialsFingerprint: fingerprint(m.Credentials)})
	}
	return evs
}

// replaceCredentials stores creds as cluster id's credentials, before the event that says so.
// They are replaced whole, so the old ones need not open: new credentials are how an operator
// recovers from a lost key.
func (s *Registry) replaceCredentials(ctx context.Context, id string, creds *clusterv1.ConnectionCredentials, origin *clusterv1.ImportOrigin) error {
	secrets, err := s.getSecretsSealed(ctx, id)
	if err != nil {
		return err
	}
	secrets.Credentials, secrets.SealedCredentials = creds, nil
	secrets.CredentialsImportOrigin = nil
	if creds != nil {
		secrets.CredentialsImportOrigin = origin
	}
	return s.putSecrets(ctx, secrets)
}

func (s *Registry) DeregisterCluster(ctx context.Context, req *connect.Request[clusterv1.DeregisterClusterRequest]) (*connect.Response[clusterv1.DeregisterClusterResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("name", m.Name)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	clusters := s.clusterKind()
	// A lost race is the caller's to resolve, as the deregistration of a cluster that changed
	// meanwhile may no longer be wanted.
	res, err := events.Command[*clusterv1.Cluster]{
		Store: s.store, Subject: subjects.Cluster(m.Name), AggregateIDOf: (*clusterv1.Cluster).GetId, MaxConflicts: -1,
		Load: clusters.Load(m.Name, m.ExpectedRevision), DryRun: m.DryRun,
		Decide: func(cur *clusterv1.Cluster) ([]proto.Message, error) {
			return []proto.Message{&clusterv1.ClusterDeregistered{Id: cur.Id}}, nil
		},
	}.Run(ctx)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if m.DryRun {
		return connect.NewResponse(&clusterv1.DeregisterClusterResponse{}), nil
	}
	cur := res.State
	// The event is the truth: agent authentication checks the registry, so a leftover token of
	// a deregistered cluster admits nobody. Removing the secrets is hygiene.
	if secrets, err := s.getSecretsSealed(ctx, cur.Id); err == nil {
		s.dropSecrets(secrets)
	}
	// The deregistration is the next event on the subject (it expected cur's revision): past
	// that revision the cluster is gone, or registered again under a new id.
	if err := clusters.AwaitPast(ctx, m.Name, cur.Revision); err != nil {
		return nil, err
	}
	s.log.Info("cluster deregistered", zap.String("cluster", m.Name), zap.String("id", cur.Id), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&clusterv1.DeregisterClusterResponse{}), nil
}

func (s *Registry) GetCluster(ctx context.Context, req *connect.Request[clusterv1.GetClusterRequest]) (*connect.Response[clusterv1.GetClusterResponse], error) {
	c, err := s.clusterKind().Get(ctx, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	res := &clusterv1.GetClusterResponse{Cluster: s.present(ctx, c)}
	if req.Msg.IncludeInventory {
		if inv := nsinventory.Assemble(s.inventory.Lookup(clusterKey(req.Msg.Name))); inv != nil {
			inv = proto.CloneOf(inv)
			inv.ClusterId = c.Id
			res.Inventory = inv
		}
	}
	return connect.NewResponse(res), nil
}

func (s *Registry) ListClusters(ctx context.Context, req *connect.Request[clusterv1.ListClustersRequest]) (*connect.Response[clusterv1.ListClustersResponse], error) {
	m := req.Msg
	var v apierr.Violations
	sel := v.Selector("label_selector", m.LabelSelector)
	page := paging.Parse(&v, paging.Request{PageSize: m.PageSize, PageToken: m.PageToken, List: "ListClusters", Filters: []string{m.LabelSelector}})
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	// Every signed-in caller lists every cluster (present trims what it may not see of each),
	// so the selector is the only filter before the page.
	list, next := paging.Slice(page, s.clusters.Entries(func(_ string, c *clusterv1.Cluster) bool { return sel.Matches(labels.Set(c.Labels)) }),
		func(e view.Entry[*clusterv1.Cluster]) string { return e.Key })
	res := &clusterv1.ListClustersResponse{Clusters: make([]*clusterv1.Cluster, len(list)), NextPageToken: next}
	for i, e := range list {
		res.Clusters[i] = s.present(ctx, e.Value)
	}
	return connect.NewResponse(res), nil
}

func (s *Registry) WatchClusters(ctx context.Context, req *connect.Request[clusterv1.WatchClustersRequest], stream *connect.ServerStream[clusterv1.WatchClustersResponse]) error {
	sel, err := viewapi.Selected(ctx, s.gate, req.Msg.LabelSelector)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	snapshot, updates := s.clusters.Subscribe(ctx, 1024)
	// What this watcher has been told exists, so that a label change moving a cluster out of
	// (or into) the selector is sent as DELETED (or ADDED).
	shown := map[string]bool{}
	send := func(u view.Update[*clusterv1.Cluster]) error {
		match := u.Op == view.Put && sel.Matches(labels.Set(u.Value.Labels))
		var typ clusterv1.WatchClustersResponse_EventType
		switch {
		case match && shown[u.Key]:
			typ = clusterv1.WatchClustersResponse_EVENT_TYPE_MODIFIED
		case match:
			typ = clusterv1.WatchClustersResponse_EVENT_TYPE_ADDED
		case shown[u.Key]:
			typ = clusterv1.WatchClustersResponse_EVENT_TYPE_DELETED
		default:
			return nil
		}
		shown[u.Key] = match
		return stream.Send(&clusterv1.WatchClustersResponse{Type: typ, Cluster: s.present(ctx, u.Value)})
	}
	for _, u := range snapshot {
		if err := send(u); err != nil {
			return err
		}
	}
	return viewapi.Watch(ctx, updates, "clusters", send)
}

// present returns c with what the agent reported continuously merged in.
// present is a cluster as caller ctx may see it. Which import lifecycle created or adopted a
// cluster names a policy and a source object on an inventory cluster, and lifecycles are
// admin-only (ListImportLifecycles), so everyone else sees the cluster without them.
func (s *Registry) present(ctx context.Context, c *clusterv1.Cluster) *clusterv1.Cluster {
	out := proto.CloneOf(c)
	if !authz.CallerFrom(ctx).Admin() {
		out.ImportedBy, out.AdoptedBy = nil, nil
	}
	if out.Status == nil {
		out.Status = &clusterv1.ClusterStatus{}
	}
	if st, ok := s.status.Get(clusterKey(c.Name)); ok {
		out.Status.LastSeen = st.LastSeen
		if st.KubernetesVersion != "" {
			out.Status.KubernetesVersion = st.KubernetesVersion
		}
		if st.AgentVersion != "" {
			out.Status.AgentVersion = st.AgentVersion
		}
	}
	if chunks := s.inventory.Lookup(clusterKey(c.Name)); len(chunks) > 0 {
		out.Status.NamespaceCount = int32(nsinventory.Count(chunks))
	}
	if cond := s.limitCondition(c.Name); cond != nil {
		out.Status.Conditions = append(out.Status.Conditions, cond)
	}
	return out
}

// awaitCluster waits until the view holds cluster name at seq or later and returns it.
func (s *Registry) awaitCluster(ctx context.Context, name string, seq uint64) (*clusterv1.Cluster, error) {
	c, _, err := s.clusterKind().Await(ctx, name, seq)
	if err != nil {
		return nil, err
	}
	return s.present(ctx, c), nil
}

// clusterKind is how the handlers read registered clusters.
func (s *Registry) clusterKind() viewapi.Kind[*clusterv1.Cluster] {
	return viewapi.Kind[*clusterv1.Cluster]{Name: "cluster", Cache: s.clusters, Key: clusterKey, Gate: s.gate}
}

func (s *Registry) putSecrets(ctx context.Context, sec *clusterv1.ClusterSecrets) error {
	data, err := encodeSecrets(s.cfg.Keyring, sec)
	if err != nil {
		return err
	}
	if _, err := s.secrets.Put(ctx, sec.ClusterId, data); err != nil {
		return fmt.Errorf("store credentials of cluster %s: %w", sec.ClusterName, err)
	}
	if sec.AgentTokenSha256 != "" {
		id, _ := proto.Marshal(&clusterv1.AgentIdentity{ClusterId: sec.ClusterId, ClusterName: sec.ClusterName})
		if _, err := s.tokens.Put(ctx, sec.AgentTokenSha256, id); err != nil {
			return fmt.Errorf("store agent token of cluster %s: %w", sec.ClusterName, err)
		}
	}
	return nil
}

func (s *Registry) getSecrets(ctx context.Context, id string) (*clusterv1.ClusterSecrets, error) {
	e, err := s.secrets.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("load credentials of cluster %s: %w", id, err)
	}
	return decodeSecrets(s.cfg.Keyring, id, e.Value())
}

// dropSecrets removes a cluster's credentials and agent token, best effort and detached from
// the caller's context (a cancelled request must not leave them behind).
func (s *Registry) dropSecrets(sec *clusterv1.ClusterSecrets) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if sec.AgentTokenSha256 != "" {
		if err := s.tokens.Purge(ctx, sec.AgentTokenSha256); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Warn("drop agent token", zap.String("cluster", sec.ClusterName), zap.Error(err))
		}
	}
	if err := s.secrets.Purge(ctx, sec.ClusterId); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Warn("drop credentials", zap.String("cluster", sec.ClusterName), zap.Error(err))
	}
}

// AgentIdentity returns which registered cluster an agent token belongs to. It is what NATS
// authentication asks; a token of a deregistered cluster is refused.
func (s *Registry) AgentIdentity(ctx context.Context, token string) (*clusterv1.AgentIdentity, bool) {
	sum := sha256.Sum256([]byte(token))
	e, err := s.tokens.Get(ctx, hex.EncodeToString(sum[:]))
	if err != nil {
		return nil, false
	}
	id := &clusterv1.AgentIdentity{}
	if proto.Unmarshal(e.Value(), id) != nil {
		return nil, false
	}
	if s.clusters == nil {
		return nil, false
	}
	key := clusterKey(id.ClusterName)
	if c, ok := s.clusters.Get(key); !ok || c.Id != id.ClusterId {
		// The token is stored before the registration reaches the registry's cache: an agent
		// started as soon as RegisterCluster answered may ask first. Refusing it cost the
		// agent a reconnect wait each time, and a fleet joining at 100 clusters a second
		// waited seconds to connect (docs/scale.md). Only a stored token waits here, and at
		// most agentIdentityWait (the auth callout allows 2 s).
		wctx, cancel := context.WithTimeout(ctx, agentIdentityWait)
		err := s.clusters.WaitFor(wctx, key, func(c *clusterv1.Cluster, ok bool) bool { return ok && c.Id == id.ClusterId })
		cancel()
		if err != nil {
			return nil, false
		}
	}
	return id, true
}

// agentIdentityWait bounds how long an agent's NATS authentication waits for its cluster's
// registration to reach the registry's cache.
const agentIdentityWait = time.Second

func newAgentToken() (token, digest string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("generate agent token: %w", err)
	}
	token = "fsa_" + base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	return token, hex.EncodeToString(sum[:]), nil
}

// fingerprint identifies credentials without revealing them; "" when there are none.
func fingerprint(c *clusterv1.ConnectionCredentials) string {
	if c == nil || proto.Size(c) == 0 {
		return ""
	}
	data, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:8])
}
