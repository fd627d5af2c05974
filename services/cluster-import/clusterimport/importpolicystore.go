package clusterimport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/pkg/viewapi"
)

// Import policies are event-sourced on FLEET_CLUSTER (fleet.cluster.importpolicy.<name>) and
// folded into the view `import-policies`. That one policy imports each (cluster, group,
// resource) is held by a KV Create in `import-policy-sources`, taken before the creation event
// and released after the deletion, so it holds across replicas.

func importPoliciesProjection() view.Projection {
	return view.Projection{
		Name:     subjects.ImportPoliciesBucket,
		Version:  1,
		Stream:   subjects.ClusterStream,
		Subjects: []string{subjects.ClusterPrefix + ".importpolicy.*"},
		Bucket:   bucketConfig(subjects.ImportPoliciesBucket, "Import policies (projection of FLEET_CLUSTER)."),
		New:      func() proto.Message { return &clusterv1.ImportPolicy{} },
		Apply:    applyImportPolicy,
	}
}

func importPolicyKey(name string) string { return keys.Encode(name) }

func applyImportPolicy(ev *events.Event) ([]view.Change, error) {
	name, err := keys.Decode(ev.Subject[strings.LastIndex(ev.Subject, ".")+1:])
	if err != nil {
		return nil, fmt.Errorf("import policy subject %s: %w", ev.Subject, err)
	}
	at := ev.GetTime()
	set := func(f func(cur *clusterv1.ImportPolicy) *clusterv1.ImportPolicy) []view.Change {
		return []view.Change{view.ChangeOf(importPolicyKey(name), f)}
	}
	switch p := ev.Payload.(type) {
	case *clusterv1.ImportPolicyCreated:
		return set(func(*clusterv1.ImportPolicy) *clusterv1.ImportPolicy {
			out := specOf(p.Policy)
			out.CreateTime, out.UpdateTime, out.Creator, out.Updater = at, at, ev.Actor, ev.Actor
			return out
		}), nil
	case *clusterv1.ImportPolicyUpdated:
		return set(func(cur *clusterv1.ImportPolicy) *clusterv1.ImportPolicy {
			if cur == nil {
				return nil
			}
			out := specOf(p.Policy)
			out.CreateTime, out.Creator, out.UpdateTime, out.Updater = cur.CreateTime, cur.Creator, at, ev.Actor
			return out
		}), nil
	case *clusterv1.ImportPolicyDeleted:
		return set(func(*clusterv1.ImportPolicy) *clusterv1.ImportPolicy { return nil }), nil
	}
	return nil, fmt.Errorf("import policy event %s not understood", ev.Type)
}

// specOf is the spec part of p: what events carry and what requests may set.
func specOf(p *clusterv1.ImportPolicy) *clusterv1.ImportPolicy {
	return &clusterv1.ImportPolicy{Name: p.GetName(), Source: p.GetSource(), References: p.GetReferences(),
		NameTemplate: p.GetNameTemplate(), Template: p.GetTemplate(), CreationCondition: p.GetCreationCondition()}
}

func sourceKey(p *clusterv1.ImportPolicy) string {
	src := p.GetSource()
	return keys.Join(src.GetCluster(), src.GetGroup(), src.GetResource())
}

func describeSource(p *clusterv1.ImportPolicy) string {
	src := p.GetSource()
	gr := src.GetResource()
	if src.GetGroup() != "" {
		gr += "." + src.GetGroup()
	}
	return fmt.Sprintf("%s on cluster %q", gr, src.GetCluster())
}

// validatePolicy checks a policy's spec with the engine that will render it, every problem
// named by its field under prefix, and that its source cluster is registered.
func (a *ImportPolicyAPI) validatePolicy(p *clusterv1.ImportPolicy) error {
	var v apierr.Violations
	if p == nil {
		v.Add("policy", "required")
		return v.Err()
	}
	for _, e := range a.engine.Validate(policyFromProto(p)) {
		v.Add("policy."+e.Field, "%s", e.Message)
	}
	if err := v.Err(); err != nil {
		return err
	}
	if _, ok := a.s.clusters.Get(clusterKey(p.Source.Cluster)); !ok {
		return apierr.FailedPrecondition("policy.source.cluster: cluster %q is not registered: the source is watched by that cluster's agent", p.Source.Cluster)
	}
	return nil
}

// A create claims its source, then appends its event, within policyWriteTimeout. So a claim
// whose policy has no event yet is a create in flight until it is older than
// Config.PolicyClaimGrace (its create died between the two; the margin covers clock skew
// between the NATS server that dated the claim and this replica), and only then taken over.
const (
	policyWriteTimeout = 30 * time.Second
	maxClaimAttempts   = 5
)

// claimSource takes the source of p for p, or says which policy has it. A claim whose policy is
// gone, has moved to another source, or never got its event within Config.PolicyClaimGrace is taken
// over.
func (a *ImportPolicyAPI) claimSource(ctx context.Context, p *clusterv1.ImportPolicy) (release func(), err error) {
	key := sourceKey(p)
	kv := a.s.policySources
	for attempt := 0; ; attempt++ {
		if _, err := kv.Create(ctx, key, []byte(p.Name)); err == nil {
			return func() { a.releaseSource(key, p.Name) }, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, apierr.Internal(fmt.Errorf("claim source %s: %w", key, err))
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) && attempt < maxClaimAttempts {
			continue // released meanwhile
		}
		if err != nil {
			return nil, apierr.Internal(fmt.Errorf("read source claim %s: %w", key, err))
		}
		owner := string(e.Value())
		if owner == p.Name {
			return func() {}, nil // already ours (an update keeping its source, or a retried create)
		}
		held, err := a.claimHeld(ctx, key, owner, e.Created())
		if err != nil {
			return nil, err
		}
		if held {
			return nil, apierr.AlreadyExists("import policy for "+describeSource(p), owner)
		}
		if _, err := kv.Update(ctx, key, []byte(p.Name), e.Revision()); err == nil {
			a.s.log.Info("took over an import policy source claim", zap.String("source", key), zap.String("from", owner))
			return func() { a.releaseSource(key, p.Name) }, nil
		} else if attempt == maxClaimAttempts {
			return nil, apierr.Aborted("source %s changed hands meanwhile, try again: %w", describeSource(p), err)
		}
		// Another writer changed the claim meanwhile: read it again.
	}
}

// sourceFree refuses, without claiming anything, what claimSource would refuse: p's source held
// by another policy's standing claim. A dry run's check.
func (a *ImportPolicyAPI) sourceFree(ctx context.Context, p *clusterv1.ImportPolicy) error {
	key := sourceKey(p)
	e, err := a.s.policySources.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil
	case err != nil:
		return apierr.Internal(fmt.Errorf("read source claim %s: %w", key, err))
	}
	owner := string(e.Value())
	if owner == p.Name {
		return nil
	}
	held, err := a.claimHeld(ctx, key, owner, e.Created())
	if err != nil {
		return err
	}
	if held {
		return apierr.AlreadyExists("import policy for "+describeSource(p), owner)
	}
	return nil
}

// claimHeld reports whether owner's claim on source key, made at created, still stands: owner's
// policy exists with that source, or its create may still be in flight.
func (a *ImportPolicyAPI) claimHeld(ctx context.Context, key, owner string, created time.Time) (bool, error) {
	_, last, err := events.Last(ctx, a.s.stream, subjects.ImportPolicy(owner))
	if err != nil {
		return false, apierr.Internal(err)
	}
	switch pl := payloadOf(last).(type) {
	case *clusterv1.ImportPolicyCreated:
		return sourceKey(pl.Policy) == key, nil
	case *clusterv1.ImportPolicyUpdated:
		return sourceKey(pl.Policy) == key, nil
	case *clusterv1.ImportPolicyDeleted:
		return false, nil
	}
	return time.Since(created) < a.s.cfg.PolicyClaimGrace, nil
}

// releaseSource drops key's claim if name still holds it; best effort, detached from the
// request (a leftover claim is taken over by the next policy for that source).
func (a *ImportPolicyAPI) releaseSource(key, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), apiwait.Patience)
	defer cancel()
	e, err := a.s.policySources.Get(ctx, key)
	if err != nil || string(e.Value()) != name {
		return
	}
	if err := a.s.policySources.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil {
		a.s.log.Warn("release import policy source", zap.String("source", key), zap.Error(err))
	}
}

func payloadOf(e *events.Event) any {
	if e == nil {
		return nil
	}
	return e.Payload
}

// policies is how the handlers read import policies.
func (a *ImportPolicyAPI) policies() viewapi.Kind[*clusterv1.ImportPolicy] {
	return viewapi.Kind[*clusterv1.ImportPolicy]{Name: "import policy", Cache: a.s.importPolicies, Key: importPolicyKey, Gate: a.s.gate}
}

func (a *ImportPolicyAPI) await(ctx context.Context, name string, seq uint64) (*clusterv1.ImportPolicy, error) {
	p, _, err := a.policies().Await(ctx, name, seq)
	return p, err
}

func (a *ImportPolicyAPI) CreateImportPolicy(ctx context.Context, req *connect.Request[clusterv1.CreateImportPolicyRequest]) (*connect.Response[clusterv1.CreateImportPolicyResponse], error) {
	if err := a.s.gate.Ready(ctx); err != nil {
		return nil, err
	}
	p := specOf(req.Msg.Policy)
	if err := a.validatePolicy(req.Msg.Policy); err != nil {
		return nil, err
	}
	if _, ok := a.s.importPolicies.Get(importPolicyKey(p.Name)); ok {
		return nil, apierr.AlreadyExists("import policy", p.Name)
	}
	// The claim and the event within policyWriteTimeout: past it, PolicyClaimGrace later, another
	// policy may take the claim over.
	wctx, cancel := context.WithTimeout(ctx, policyWriteTimeout)
	defer cancel()
	var release func()
	var claimErr error
	res, err := events.Command[*events.Event]{
		Store: a.s.store, Subject: subjects.ImportPolicy(p.Name), AggregateID: p.Name, MaxConflicts: -1, DryRun: req.Msg.DryRun,
		// The view may not show a creation appended a moment ago: the subject itself must be
		// empty or end in a deletion, and is expected as it is, so of two concurrent creations
		// one appends.
		Load: func(ctx context.Context, _ uint64) (*events.Event, uint64, error) {
			seq, last, err := events.Last(ctx, a.s.stream, subjects.ImportPolicy(p.Name))
			return last, seq, err
		},
		Decide: func(last *events.Event) ([]proto.Message, error) {
			if _, gone := payloadOf(last).(*clusterv1.ImportPolicyDeleted); last != nil && !gone {
				return nil, apierr.AlreadyExists("import policy", p.Name)
			}
			return []proto.Message{&clusterv1.ImportPolicyCreated{Policy: p}}, nil
		},
		BeforeAppend: func(ctx context.Context, _ *events.Event, _ proto.Message) error {
			release, claimErr = a.claimSource(ctx, p)
			return claimErr
		},
	}.Run(wctx)
	switch {
	case claimErr != nil:
		return nil, claimErr // its own answer, a lost race on the claim included
	case events.IsConflict(err):
		release() // certainly not appended
		return nil, apierr.AlreadyExists("import policy", p.Name)
	case err != nil:
		// The event may have landed (a timeout): the claim stays, and is taken over after
		// PolicyClaimGrace if the policy never appears.
		return nil, apierr.Internal(err)
	case req.Msg.DryRun:
		// A dry run takes no claim (BeforeAppend does not run): it only reads whether the
		// source is free.
		if err := a.sourceFree(ctx, p); err != nil {
			return nil, err
		}
		return connect.NewResponse(&clusterv1.CreateImportPolicyResponse{Policy: p}), nil
	}
	seq := res.Sequence
	out, err := a.await(ctx, p.Name, seq)
	if err != nil {
		return nil, err
	}
	a.s.log.Info("import policy created", zap.String("policy", p.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&clusterv1.CreateImportPolicyResponse{Policy: a.s.lifecycles.withStatus(out)}), nil
}

func (a *ImportPolicyAPI) UpdateImportPolicy(ctx context.Context, req *connect.Request[clusterv1.UpdateImportPolicyRequest]) (*connect.Response[clusterv1.UpdateImportPolicyResponse], error) {
	if err := a.s.gate.Ready(ctx); err != nil {
		return nil, err
	}
	if err := a.validatePolicy(req.Msg.Policy); err != nil {
		return nil, err
	}
	p := specOf(req.Msg.Policy)
	release := func() {}
	wctx, cancel := context.WithTimeout(ctx, policyWriteTimeout) // as in CreateImportPolicy
	defer cancel()
	res, err := events.Command[*clusterv1.ImportPolicy]{
		Store: a.s.store, Subject: subjects.ImportPolicy(p.Name), AggregateID: p.Name, MaxConflicts: -1,
		Load: a.policies().Load(p.Name, req.Msg.ExpectedRevision), DryRun: req.Msg.DryRun,
		Decide: func(cur *clusterv1.ImportPolicy) ([]proto.Message, error) {
			if proto.Equal(p, specOf(cur)) {
				return nil, nil
			}
			if req.Msg.DryRun && sourceKey(p) != sourceKey(cur) {
				// BeforeAppend's claim, checked without taking it.
				if err := a.sourceFree(wctx, p); err != nil {
					return nil, err
				}
			}
			return []proto.Message{&clusterv1.ImportPolicyUpdated{Policy: p}}, nil
		},
		// A policy moving to another source claims it first, as a creation does.
		BeforeAppend: func(ctx context.Context, cur *clusterv1.ImportPolicy, _ proto.Message) error {
			if sourceKey(p) == sourceKey(cur) {
				return nil
			}
			var err error
			release, err = a.claimSource(ctx, p)
			return err
		},
	}.Run(wctx)
	switch {
	case events.IsConflict(err):
		release() // certainly not appended
		return nil, apierr.Aborted("import policy %q changed meanwhile, read it again: %w", p.Name, err)
	case err != nil:
		// The event may have landed: the new source's claim stays (taken over at once if the
		// policy turns out to keep its old source: claimHeld).
		return nil, apierr.Internal(err)
	case len(res.Events) == 0:
		return connect.NewResponse(&clusterv1.UpdateImportPolicyResponse{Policy: a.s.lifecycles.withStatus(res.State)}), nil
	case req.Msg.DryRun:
		next := proto.CloneOf(p)
		next.Revision, next.CreateTime = res.State.Revision, res.State.CreateTime
		return connect.NewResponse(&clusterv1.UpdateImportPolicyResponse{Policy: next}), nil
	}
	if cur := res.State; sourceKey(p) != sourceKey(cur) {
		a.releaseSource(sourceKey(cur), p.Name)
	}
	seq := res.Sequence
	out, err := a.await(ctx, p.Name, seq)
	if err != nil {
		return nil, err
	}
	a.s.log.Info("import policy updated", zap.String("policy", p.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&clusterv1.UpdateImportPolicyResponse{Policy: a.s.lifecycles.withStatus(out)}), nil
}

func (a *ImportPolicyAPI) DeleteImportPolicy(ctx context.Context, req *connect.Request[clusterv1.DeleteImportPolicyRequest]) (*connect.Response[clusterv1.DeleteImportPolicyResponse], error) {
	var v apierr.Violations
	v.DNSLabel("name", req.Msg.Name)
	if err := a.s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	policies := a.policies()
	res, err := events.Command[*clusterv1.ImportPolicy]{
		Store: a.s.store, Subject: subjects.ImportPolicy(req.Msg.Name), AggregateID: req.Msg.Name, MaxConflicts: -1,
		Load: policies.Load(req.Msg.Name, req.Msg.ExpectedRevision), DryRun: req.Msg.DryRun,
		Decide: func(cur *clusterv1.ImportPolicy) ([]proto.Message, error) {
			return []proto.Message{&clusterv1.ImportPolicyDeleted{Name: cur.Name}}, nil
		},
	}.Run(ctx)
	if events.IsConflict(err) {
		return nil, apierr.Aborted("import policy %q changed meanwhile, read it again: %w", req.Msg.Name, err)
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	if req.Msg.DryRun {
		return connect.NewResponse(&clusterv1.DeleteImportPolicyResponse{}), nil
	}
	cur := res.State
	a.releaseSource(sourceKey(cur), cur.Name)
	if err := policies.AwaitPast(ctx, cur.Name, cur.Revision); err != nil {
		return nil, err
	}
	a.s.log.Info("import policy deleted", zap.String("policy", cur.Name), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&clusterv1.DeleteImportPolicyResponse{}), nil
}

func (a *ImportPolicyAPI) GetImportPolicy(ctx context.Context, req *connect.Request[clusterv1.GetImportPolicyRequest]) (*connect.Response[clusterv1.GetImportPolicyResponse], error) {
	p, err := a.policies().Get(ctx, req.Msg.Name)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&clusterv1.GetImportPolicyResponse{Policy: a.s.lifecycles.withStatus(p)}), nil
}

func (a *ImportPolicyAPI) ListImportPolicies(ctx context.Context, _ *connect.Request[clusterv1.ListImportPoliciesRequest]) (*connect.Response[clusterv1.ListImportPoliciesResponse], error) {
	list, err := a.policies().List(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := make([]*clusterv1.ImportPolicy, len(list))
	for i, p := range list {
		out[i] = a.s.lifecycles.withStatus(p)
	}
	return connect.NewResponse(&clusterv1.ListImportPoliciesResponse{Policies: out}), nil
}
