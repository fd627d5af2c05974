package clusterimport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/importpolicy"
	"github.com/fleetstream/fleetstream/pkg/kubecreds"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Lifecycle condition types and reasons beyond pkg/importpolicy's.
const (
	ConditionCreated = "Created"
	ConditionAdopted = "Adopted"
	// ConditionCredentials says, for an adopted cluster, whether the credentials the policy
	// renders are the cluster's: an adoption attaches them only where they take over nothing.
	ConditionCredentials = "CredentialsAttached"

	// LabelAllowImportCredentials set to "true" on a cluster (by a platform admin: only
	// RegisterCluster and UpdateCluster set an existing cluster's labels, and an import never
	// renders this one) lets an adopting import replace the cluster's credentials, even once
	// its own agent has connected.
	LabelAllowImportCredentials = importpolicy.LabelAllowImportCredentials

	reasonCredentialsAttached = "Attached"
	reasonHasCredentials      = "ClusterHasCredentials"
	reasonAgentConnected      = "AgentConnected"

	reasonCreated            = "Created"
	reasonAdopted            = "Adopted"
	reasonNotCreated         = "NotCreated"
	reasonNotAdopted         = "NotAdopted"
	reasonConditionFalse     = "CreationConditionFalse"
	reasonNotRendered        = "NotRendered"
	reasonInvalidCluster     = "InvalidCluster"
	reasonRegistryError      = "RegistryError"
	reasonSourceTooLarge     = "SourceTooLarge"
	removedSourceDeleted     = "SourceDeleted"
	removedPolicyDeleted     = "PolicyDeleted"
	removedNameChanged       = "NameChanged"
	removedSourceNotSelected = "SourceNotSelected"
)

// Timing of the lifecycle controller.
const (
	// lifecycleDebounce gathers a burst of changes (a relist, a policy's every source) into
	// one pass.
	lifecycleDebounce = 100 * time.Millisecond
	// lifecycleResync re-runs a pass without changes: what failed (a registry conflict, an
	// unavailable bucket) is retried then at the latest.
	lifecycleResync = 30 * time.Second
)

// lifecycles is the import lifecycle controller: for every policy and every source object
// its inventory cluster's agent reports, it renders the policy and creates, adopts, updates or
// removes the cluster. It keeps no state of its own beyond status: everything follows from
// the reported sources, the policies and the registry (clusters carry which lifecycle created
// or adopted them), so a restart or a second replica reaches the same result. Concurrent
// replicas race on the registry's per-subject sequence expectations: one wins, the other
// retries on fresh state.
type lifecycles struct {
	s       *Registry
	engine  *importpolicy.Engine
	sources *importSources
	kickCh  chan struct{}

	mu       sync.Mutex
	status   map[string][]*clusterv1.ImportLifecycle
	compiled map[string]compiledPolicy
	// watchWritten is the last ImportWatch written per inventory cluster.
	watchWritten map[string][]byte
	// started and passes count begun and completed passes (WaitImportPass).
	started, passes uint64
	// sourceObjects counts, by policy, the source objects of the last pass.
	sourceObjects map[string]int
	// memo holds each lifecycle's last render; only the reconcile loop touches it.
	memo map[string]*renderMemo
}

// renderMemo is the last render of one lifecycle and what it read: it is reused while the
// policy revision, the source object and every object its references resolved to are the
// same ones (reported objects keep their identity while their content does not change).
type renderMemo struct {
	revision uint64
	source   *reportedObject
	reads    []memoRead
	res      *importpolicy.Result
	at       time.Time
}

type memoRead struct {
	ref    objectRef
	target *agentv1.WatchedObject
	obj    *reportedObject
}

type compiledPolicy struct {
	revision uint64
	c        *importpolicy.Compiled
	err      error
}

func newLifecycles(s *Registry) *lifecycles {
	l := &lifecycles{s: s, engine: importpolicy.NewEngine(importpolicy.Limits{}).WithCredentialsPolicy(s.cfg.Credentials), kickCh: make(chan struct{}, 1),
		status: map[string][]*clusterv1.ImportLifecycle{}, compiled: map[string]compiledPolicy{}, watchWritten: map[string][]byte{},
		memo: map[string]*renderMemo{}}
	l.sources = newImportSources(l.kick)
	return l
}

func (l *lifecycles) kick() {
	select {
	case l.kickCh <- struct{}{}:
	default:
	}
}

// run reads the sources and reconciles on every change until ctx ends.
func (l *lifecycles) run(ctx context.Context) error {
	select {
	case <-l.s.ready:
	case <-ctx.Done():
		return nil
	}
	go func() {
		// A failed consumer (the stream recreated, a lost connection) is rebuilt; its replay
		// of the latest reports is idempotent.
		for ctx.Err() == nil {
			if err := l.sources.run(ctx, l.s.js, l.s.log); err != nil && ctx.Err() == nil {
				l.s.log.Warn("import sources consumer failed; restarting", zap.Error(err))
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	go l.follow(ctx, func(ctx context.Context) <-chan struct{} { return changes(ctx, l.s.importPolicies.Updates(ctx, 1024)) })
	go l.follow(ctx, func(ctx context.Context) <-chan struct{} { return changes(ctx, l.s.clusters.Updates(ctx, 1024)) })
	select {
	case <-l.sources.caughtUp:
	case <-ctx.Done():
		return nil
	}
	resync := time.NewTicker(lifecycleResync)
	defer resync.Stop()
	for {
		l.reconcile(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-resync.C:
		case <-l.kickCh:
			// More changes usually follow the first: take them in the same pass.
			select {
			case <-time.After(lifecycleDebounce):
			case <-ctx.Done():
				return nil
			}
		}
	}
}

// follow kicks the controller on every change a view subscription reports, resubscribing when
// it falls behind.
func (l *lifecycles) follow(ctx context.Context, sub func(context.Context) <-chan struct{}) {
	for ctx.Err() == nil {
		for range sub(ctx) {
			l.kick()
		}
		l.kick()
	}
}

func changes[T any](ctx context.Context, in <-chan T) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		defer close(out)
		for range in {
			select {
			case out <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func originKey(o *clusterv1.ImportOrigin) string {
	src := o.GetSource()
	return strings.Join([]string{o.GetPolicy(), src.GetCluster(), src.GetGroup(), src.GetResource(), src.GetNamespace(), src.GetName()}, "\x00")
}

type owner struct {
	cluster *clusterv1.Cluster
	adopted bool
	origin  *clusterv1.ImportOrigin
}

// pass is one reconcile's working state.
type pass struct {
	ctx      context.Context
	l        *lifecycles
	sources  map[string]int
	byOrigin map[string][]owner
	live     map[string]bool
	seen     map[string]bool
	watch    map[string]*watchSet
	now      time.Time
	// creations are the clusters this pass registers, after every lifecycle was judged and
	// concurrently: one after the other, each waiting for the registry view, they made
	// importing 1,000 clusters seven times slower than registering them (docs/benchmarks.md).
	creations []creation
	// ends are the holds on clusters this pass ends, after every lifecycle was judged: only
	// then is it known which adopter still renders a name its creator leaves (heir).
	ends []end
	// ended holds holdKey of every hold in ends.
	ended map[string]bool
}

// end is a lifecycle's hold on a cluster that ends, and why.
type end struct {
	o      owner
	reason string
}

func holdKey(o *clusterv1.ImportOrigin, cluster string) string {
	return originKey(o) + "\x00" + cluster
}

// end queues the end of o's hold on its cluster (endHolds).
func (p *pass) end(o owner, reason string) {
	p.ended[holdKey(o.origin, o.cluster.Name)] = true
	p.ends = append(p.ends, end{o: o, reason: reason})
}

// endHolds ends the queued holds. A cluster whose creator leaves while a lifecycle that
// adopted it still renders its name is handed over to that adopter instead of deregistered:
// its id, agent token and everything placed on it stay.
func (p *pass) endHolds() {
	for _, e := range p.ends {
		if !e.o.adopted {
			if heir := p.heir(e.o); heir != nil {
				p.handOver(e.o, heir, e.reason)
				continue
			}
		}
		p.remove(e.o, e.reason)
	}
	p.ends = nil
}

// heir returns the first adopter of o's cluster that keeps holding it after this pass: its
// lifecycle exists (rendered or not: what cannot be rendered keeps what it holds) and did not
// let go of the name.
func (p *pass) heir(o owner) *clusterv1.ImportOrigin {
	for _, a := range o.cluster.AdoptedBy {
		if p.live[originKey(a)] && !p.ended[holdKey(a, o.cluster.Name)] {
			return a
		}
	}
	return nil
}

// handOver makes heir, an adopter of o's cluster, its creator in o's place: one
// ClusterImported naming heir, which the projection folds into imported_by (and out of
// adopted_by). Credentials the leaving creator attached are recorded as heir's first: from
// the next pass on heir keeps them up to date as its own, replacing them with what it renders,
// or removing them when it renders none.
func (p *pass) handOver(o owner, heir *clusterv1.ImportOrigin, reason string) {
	c, s := o.cluster, p.l.s
	if c.GetStatus().GetCredentialsFingerprint() != "" {
		sec, err := s.getSecretsSealed(p.ctx, c.Id)
		if err != nil {
			s.log.Warn("handed-over cluster's credentials not read; retrying", zap.String("cluster", c.Name), zap.Error(err))
			p.l.kick()
			return
		}
		if sameOrigin(sec.CredentialsImportOrigin, o.origin) {
			sec.CredentialsImportOrigin = heir
			if err := s.putSecrets(p.ctx, sec); err != nil {
				s.log.Warn("handed-over cluster's credentials not recorded; retrying", zap.String("cluster", c.Name), zap.Error(err))
				p.l.kick()
				return
			}
		}
	}
	if _, err := s.store.Append(p.ctx, subjects.Cluster(c.Name), c.Id, events.At(c.Revision),
		&clusterv1.ClusterImported{Id: c.Id, Name: c.Name, Origin: heir}); err != nil {
		if !events.IsConflict(err) {
			s.log.Warn("imported cluster not handed over; retrying", zap.String("cluster", c.Name), zap.Error(err))
		}
		p.l.kick()
		return
	}
	s.log.Info("import lifecycle ended; cluster handed over to an adopter", zap.String("cluster", c.Name), zap.String("policy", o.origin.Policy),
		zap.String("reason", reason), zap.String("to_policy", heir.Policy), zap.String("to_source", heir.Source.GetNamespace()+"/"+heir.Source.GetName()))
}

// creation is a cluster a lifecycle creates.
type creation struct {
	lc     *clusterv1.ImportLifecycle
	req    *clusterv1.RegisterClusterRequest
	origin *clusterv1.ImportOrigin
}

// createParallelism bounds the registrations a pass makes at once.
const createParallelism = 16

// create registers the pass's new clusters, at most createParallelism at once. Two
// lifecycles rendering the same new name: the first registers it, the other adopts it on the
// next pass (the registration changes the registry, which starts one).
func (p *pass) create() {
	var g errgroup.Group
	g.SetLimit(createParallelism)
	names := map[string]bool{}
	for _, c := range p.creations {
		at := c.lc.LastRenderTime
		if names[c.req.Name] {
			c.lc.Conditions = append(c.lc.Conditions, condition(ConditionCreated, false, reasonNotCreated,
				"another lifecycle is creating cluster "+c.req.Name+"; it is adopted on the next pass", at), condition(ConditionAdopted, false, reasonNotAdopted, "", at))
			continue
		}
		names[c.req.Name] = true
		g.Go(func() error {
			cl, err := p.l.s.register(p.ctx, c.req, c.origin)
			if err != nil {
				c.lc.Conditions = append(c.lc.Conditions, condition(ConditionCreated, false, reasonRegistryError, fmt.Sprintf("registering cluster %s: %v", c.req.Name, err), at),
					condition(ConditionAdopted, false, reasonNotAdopted, "", at))
				return nil
			}
			p.l.s.log.Info("cluster imported", zap.String("cluster", cl.Name), zap.String("policy", c.origin.Policy),
				zap.String("source", c.origin.Source.Namespace+"/"+c.origin.Source.Name))
			c.lc.Cluster, c.lc.ClusterId, c.lc.Mode = cl.Name, cl.Id, clusterv1.ImportMode_IMPORT_MODE_CREATED
			c.lc.Conditions = append(c.lc.Conditions, condition(ConditionCreated, true, reasonCreated, "created cluster "+cl.Name, at),
				condition(ConditionAdopted, false, reasonNotAdopted, "", at))
			return nil
		})
	}
	_ = g.Wait()
	p.creations = nil
}

type watchSet struct {
	sources map[objectRef]*agentv1.WatchedType
	refs    map[objectRef]*agentv1.WatchedObject
}

func (p *pass) watchOf(cluster string) *watchSet {
	w := p.watch[cluster]
	if w == nil {
		w = &watchSet{sources: map[objectRef]*agentv1.WatchedType{}, refs: map[objectRef]*agentv1.WatchedObject{}}
		p.watch[cluster] = w
	}
	return w
}

func (l *lifecycles) reconcile(ctx context.Context) {
	l.mu.Lock()
	l.started++
	l.mu.Unlock()
	p := &pass{ctx: ctx, l: l, sources: map[string]int{}, byOrigin: map[string][]owner{}, live: map[string]bool{}, seen: map[string]bool{}, watch: map[string]*watchSet{}, now: l.s.now(), ended: map[string]bool{}}
	for _, c := range l.s.clusters.List(nil) {
		if c.ImportedBy != nil {
			p.byOrigin[originKey(c.ImportedBy)] = append(p.byOrigin[originKey(c.ImportedBy)], owner{cluster: c, origin: c.ImportedBy})
		}
		for _, o := range c.AdoptedBy {
			p.byOrigin[originKey(o)] = append(p.byOrigin[originKey(o)], owner{cluster: c, adopted: true, origin: o})
		}
	}
	policies := l.s.importPolicies.List(nil)
	status := map[string][]*clusterv1.ImportLifecycle{}
	known := map[string]bool{}
	for _, pol := range policies {
		known[pol.Name] = true
		status[pol.Name] = p.policy(pol)
	}
	p.create()
	// Lifecycles that no longer exist: their source went, or their policy.
	for key, owners := range p.byOrigin {
		if p.live[key] {
			continue
		}
		for _, o := range owners {
			reason := removedSourceDeleted
			if !known[o.origin.Policy] {
				reason = removedPolicyDeleted
			}
			p.end(o, reason)
		}
	}
	p.endHolds()
	for key := range l.memo {
		if !p.seen[key] {
			delete(l.memo, key)
		}
	}
	l.writeWatches(ctx, p.watch)
	l.mu.Lock()
	l.status = status
	l.sourceObjects = p.sources
	l.passes++
	l.mu.Unlock()
}

// policy reconciles every lifecycle of pol and returns their status.
func (p *pass) policy(pol *clusterv1.ImportPolicy) []*clusterv1.ImportLifecycle {
	l := p.l
	src := pol.GetSource()
	inv := src.GetCluster()
	w := p.watchOf(inv)
	if !(src.GetGroup() == "" && src.GetResource() == "secrets") {
		w.sources[objectRef{src.GetGroup(), src.GetResource(), src.GetNamespace(), ""}] = &agentv1.WatchedType{
			Group: src.GetGroup(), Version: src.GetVersion(), Resource: src.GetResource(), Namespace: src.GetNamespace()}
	}
	cp := l.compile(pol)
	objs := l.sources.sourceObjects(inv, src.GetGroup(), src.GetResource(), src.GetNamespace())
	p.sources[pol.Name] = len(objs)
	refs := make([]objectRef, 0, len(objs))
	for ref := range objs {
		refs = append(refs, ref)
	}
	slices.SortFunc(refs, func(a, b objectRef) int { return strings.Compare(a.namespace+"/"+a.name, b.namespace+"/"+b.name) })
	var out []*clusterv1.ImportLifecycle
	for _, ref := range refs {
		obj := objs[ref]
		origin := &clusterv1.ImportOrigin{Policy: pol.Name, Source: &clusterv1.ImportSourceRef{
			Cluster: inv, Group: ref.group, Version: obj.version, Resource: ref.resource, Namespace: ref.namespace, Name: ref.name}}
		key := originKey(origin)
		lc := &clusterv1.ImportLifecycle{Policy: pol.Name, Source: origin.Source, LastRenderTime: timestamppb.New(p.now)}
		if cp.err != nil || obj.tooLarge {
			// Nothing can be decided: what exists stays as it is.
			p.live[key] = true
			lc.LastRenderTime = timestamppb.New(p.unrendered(key, pol.Revision, obj))
			msg, reason := fmt.Sprintf("the policy does not compile: %v", cp.err), importpolicy.ReasonInvalidPolicy
			if obj.tooLarge {
				msg, reason = "the agent could not report the object: it does not fit in a NATS message", reasonSourceTooLarge
			}
			lc.Conditions = []*clusterv1.Condition{{Type: importpolicy.ConditionSourceValid, Status: clusterv1.ConditionStatus_CONDITION_STATUS_FALSE, Reason: reason, Message: msg}}
			p.describeOwners(lc, p.byOrigin[key], "")
			out = append(out, lc)
			continue
		}
		res, at := p.render(key, pol.Revision, cp.c, inv, obj, w)
		lc.LastRenderTime = timestamppb.New(at)
		lc.Name = res.Name
		for _, c := range res.Conditions {
			lc.Conditions = append(lc.Conditions, &clusterv1.Condition{Type: c.Type, Status: conditionStatus(c.Status), Reason: c.Reason, Message: c.Message, LastTransitionTime: lc.LastRenderTime})
		}
		if !res.Selected && len(res.Conditions) > 0 && res.Conditions[0].Reason == importpolicy.ReasonNotSelected {
			// Not selected: no lifecycle; what an earlier one made goes (below).
			continue
		}
		p.live[key] = true
		p.act(lc, res, origin, p.byOrigin[key])
		out = append(out, lc)
	}
	return out
}

func (l *lifecycles) compile(pol *clusterv1.ImportPolicy) compiledPolicy {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cp, ok := l.compiled[pol.Name]; ok && cp.revision == pol.Revision {
		return cp
	}
	c, errs := l.engine.Compile(policyFromProto(pol))
	cp := compiledPolicy{revision: pol.Revision, c: c, err: errs.Err()}
	l.compiled[pol.Name] = cp
	return cp
}

// render renders one lifecycle, or reuses its last render when nothing it read changed.
// Either way the references it reads are asked of the agent.
func (p *pass) render(key string, revision uint64, c *importpolicy.Compiled, inv string, src *reportedObject, w *watchSet) (*importpolicy.Result, time.Time) {
	p.seen[key] = true
	if m := p.l.memo[key]; m != nil && m.revision == revision && m.source == src && m.res != nil {
		valid := true
		for _, r := range m.reads {
			if p.l.sources.object(inv, r.ref) != r.obj {
				valid = false
				break
			}
		}
		if valid {
			for _, r := range m.reads {
				w.refs[r.ref] = r.target
			}
			return m.res, m.at
		}
	}
	m := &renderMemo{revision: revision, source: src, at: p.l.s.now()}
	m.res = p.l.engine.Render(p.ctx, c, src.json, p.fetcher(inv, w, m))
	p.l.memo[key] = m
	return m.res, m.at
}

// unrendered records a lifecycle that cannot be rendered and returns since when.
func (p *pass) unrendered(key string, revision uint64, src *reportedObject) time.Time {
	p.seen[key] = true
	if m := p.l.memo[key]; m != nil && m.revision == revision && m.source == src && m.res == nil {
		return m.at
	}
	m := &renderMemo{revision: revision, source: src, at: p.l.s.now()}
	p.l.memo[key] = m
	return m.at
}

// fetcher resolves references from what inv's agent reported, and asks the agent for each
// one it is asked for: the next ImportWatch names it.
func (p *pass) fetcher(inv string, w *watchSet, m *renderMemo) importpolicy.Fetcher {
	return importpolicy.FetcherFunc(func(_ context.Context, t importpolicy.Target) ([]byte, error) {
		ref := objectRef{t.Group, t.Resource, t.Namespace, t.Name}
		target := &agentv1.WatchedObject{Group: t.Group, Version: t.Version, Resource: t.Resource, Namespace: t.Namespace, Name: t.Name}
		w.refs[ref] = target
		o := p.l.sources.object(inv, ref)
		m.reads = append(m.reads, memoRead{ref: ref, target: target, obj: o})
		switch {
		case o == nil:
			return nil, fmt.Errorf("not reported by the agent of cluster %q yet: %w", inv, importpolicy.ErrNotFound)
		case o.deleted:
			return nil, fmt.Errorf("does not exist on cluster %q: %w", inv, importpolicy.ErrNotFound)
		case o.tooLarge:
			return nil, errors.New("too large for the agent to report")
		}
		return o.json, nil
	})
}

func condition(typ string, ok bool, reason, msg string, at *timestamppb.Timestamp) *clusterv1.Condition {
	st := clusterv1.ConditionStatus_CONDITION_STATUS_FALSE
	if ok {
		st = clusterv1.ConditionStatus_CONDITION_STATUS_TRUE
	}
	return &clusterv1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, LastTransitionTime: at}
}

// describeOwners sets lc's cluster, mode and Created/Adopted conditions from the clusters the
// lifecycle holds; notCreated says why none was created when there is none.
func (p *pass) describeOwners(lc *clusterv1.ImportLifecycle, owners []owner, notCreated string) {
	at := lc.LastRenderTime
	for _, o := range owners {
		if o.cluster.Name != lc.Name && lc.Name != "" {
			continue
		}
		lc.Cluster, lc.ClusterId = o.cluster.Name, o.cluster.Id
		if o.adopted {
			lc.Mode = clusterv1.ImportMode_IMPORT_MODE_ADOPTED
			lc.Conditions = append(lc.Conditions,
				condition(ConditionCreated, false, reasonNotCreated, "cluster "+o.cluster.Name+" existed before this lifecycle", at),
				condition(ConditionAdopted, true, reasonAdopted, "adopted cluster "+o.cluster.Name+": it is never deregistered by this lifecycle", at))
		} else {
			lc.Mode = clusterv1.ImportMode_IMPORT_MODE_CREATED
			lc.Conditions = append(lc.Conditions,
				condition(ConditionCreated, true, reasonCreated, "created cluster "+o.cluster.Name, at),
				condition(ConditionAdopted, false, reasonNotAdopted, "", at))
		}
		return
	}
	if notCreated == "" {
		notCreated = "the policy did not render"
	}
	lc.Conditions = append(lc.Conditions,
		condition(ConditionCreated, false, reasonNotRendered, notCreated, at),
		condition(ConditionAdopted, false, reasonNotAdopted, "", at))
}

// act creates, adopts or updates the cluster of one lifecycle.
func (p *pass) act(lc *clusterv1.ImportLifecycle, res *importpolicy.Result, origin *clusterv1.ImportOrigin, owners []owner) {
	at := lc.LastRenderTime
	if res.Cluster == nil || res.Name == "" || len(res.Errors) > 0 {
		// A failed render changes nothing; it is retried when an input changes.
		p.describeOwners(lc, owners, "the policy did not render: see the other conditions")
		return
	}
	var mine *owner
	for i, o := range owners {
		if o.cluster.Name == res.Name {
			mine = &owners[i]
			continue
		}
		// The name changed: the old cluster goes, the new one is created or adopted.
		p.end(o, removedNameChanged)
	}
	req, problem := registerRequest(res, p.l.s.cfg.Credentials)
	if mine != nil {
		p.describeOwners(lc, []owner{*mine}, "")
		if problem == "" {
			p.syncCredentials(lc, mine.cluster, req.Credentials, mine.adopted, origin)
		}
		return
	}
	if cur, exists := p.l.s.clusters.Get(clusterKey(res.Name)); exists {
		if err := p.adopt(cur, origin); err != nil {
			lc.Conditions = append(lc.Conditions, condition(ConditionCreated, false, reasonNotCreated, "cluster "+res.Name+" exists", at),
				condition(ConditionAdopted, false, reasonRegistryError, fmt.Sprintf("adopting cluster %s: %v", res.Name, err), at))
			return
		}
		lc.Cluster, lc.ClusterId, lc.Mode = cur.Name, cur.Id, clusterv1.ImportMode_IMPORT_MODE_ADOPTED
		lc.Conditions = append(lc.Conditions, condition(ConditionCreated, false, reasonNotCreated, "cluster "+res.Name+" existed before this lifecycle", at),
			condition(ConditionAdopted, true, reasonAdopted, "adopted cluster "+res.Name+": it is never deregistered by this lifecycle", at))
		return
	}
	switch {
	case !res.Create:
		lc.Conditions = append(lc.Conditions, condition(ConditionCreated, false, reasonConditionFalse, "creation_condition does not render true", at),
			condition(ConditionAdopted, false, reasonNotAdopted, "", at))
		return
	case problem != "":
		lc.Conditions = append(lc.Conditions, condition(ConditionCreated, false, reasonInvalidCluster, problem, at),
			condition(ConditionAdopted, false, reasonNotAdopted, "", at))
		return
	}
	p.creations = append(p.creations, creation{lc: lc, req: req, origin: origin})
}

// registerRequest maps a rendered cluster to a registration, and says what the registry
// would refuse (never quoting credentials).
func registerRequest(res *importpolicy.Result, creds kubecreds.Policy) (*clusterv1.RegisterClusterRequest, string) {
	d := res.Cluster
	req := &clusterv1.RegisterClusterRequest{Name: res.Name, Labels: d.Labels, Claims: d.Claims}
	for _, t := range d.Taints {
		req.Taints = append(req.Taints, &clusterv1.Taint{Key: t.Key, Value: t.Value, Effect: clusterv1.TaintEffect(clusterv1.TaintEffect_value[t.Effect])})
	}
	if c := d.Credentials; c != nil {
		req.Credentials = &clusterv1.ConnectionCredentials{Kubeconfig: c.Kubeconfig, Server: c.Server, CertificateAuthorityData: c.CertificateAuthorityData,
			Token: c.Token, ClientCertificateData: c.ClientCertificateData, ClientKeyData: c.ClientKeyData}
	}
	var v apierr.Violations
	validateMeta(&v, req.Labels, req.Claims, req.Taints)
	if _, ok := req.Labels[LabelAllowImportCredentials]; ok {
		v.Add("labels["+LabelAllowImportCredentials+"]", "only a platform admin sets this label (UpdateCluster), never an import")
	}
	validateCredentials(&v, "credentials", req.Credentials, creds)
	if err := v.Err(); err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return req, ce.Message()
		}
		return req, err.Error()
	}
	return req, ""
}

// syncCredentials stores rendered connection credentials that differ from the stored ones.
// A cluster the lifecycle created is its own. An adopted one is not: the lifecycle replaces
// only credentials it attached itself, and attaches them only to a cluster that has none and
// whose own agent never connected, unless a platform admin allowed more with
// LabelAllowImportCredentials. Otherwise an inventory a tenant can write to (the Secret the
// policy reads) would take over a cluster registered by hand: its hosted agent would drive the
// cluster with those credentials once the cluster's own agent went quiet. What is not applied
// is the lifecycle's CredentialsAttached condition. An adopted cluster keeps its own when the
// policy renders none (and the lifecycle has no such condition).
func (p *pass) syncCredentials(lc *clusterv1.ImportLifecycle, c *clusterv1.Cluster, creds *clusterv1.ConnectionCredentials, adopted bool, origin *clusterv1.ImportOrigin) {
	at := lc.LastRenderTime
	fp := fingerprint(creds)
	if adopted && fp == "" {
		return
	}
	if fp == c.GetStatus().GetCredentialsFingerprint() {
		if adopted {
			lc.Conditions = append(lc.Conditions, condition(ConditionCredentials, true, reasonCredentialsAttached, "the cluster has the credentials the policy renders", at))
		}
		return
	}
	if adopted {
		sec, err := p.l.s.getSecretsSealed(p.ctx, c.Id)
		if err != nil {
			p.l.s.log.Warn("adopted cluster's credentials not read; retrying", zap.String("cluster", c.Name), zap.Error(err))
			p.l.kick()
			return
		}
		ours := sec.CredentialsImportOrigin != nil && sameOrigin(sec.CredentialsImportOrigin, origin)
		allowed := c.Labels[LabelAllowImportCredentials] == "true"
		refuse := func(reason, why string) {
			lc.Conditions = append(lc.Conditions, condition(ConditionCredentials, false, reason,
				fmt.Sprintf("not attached: %s; an adoption never takes a cluster over (a platform admin may allow it with label %s=true)", why, LabelAllowImportCredentials), at))
		}
		switch {
		case ours || allowed:
		case c.GetStatus().GetCredentialsFingerprint() != "":
			refuse(reasonHasCredentials, "cluster "+c.Name+" has credentials this lifecycle did not attach")
			return
		case agentHasConnected(c):
			refuse(reasonAgentConnected, "cluster "+c.Name+"'s own agent has connected")
			return
		}
	}
	if _, err := p.l.s.update(p.ctx, c, &clusterv1.UpdateClusterRequest{Name: c.Name, Credentials: creds}, []string{"credentials"}, origin); err != nil {
		if !events.IsConflict(err) {
			p.l.s.log.Warn("imported cluster's credentials not updated; retrying", zap.String("cluster", c.Name), zap.Error(err))
		}
		p.l.kick()
		return
	}
	if adopted {
		lc.Conditions = append(lc.Conditions, condition(ConditionCredentials, true, reasonCredentialsAttached, "attached the credentials the policy renders", at))
	}
	p.l.s.log.Info("imported cluster's credentials updated", zap.String("cluster", c.Name))
}

// agentHasConnected reports whether any agent ever sent the cluster a heartbeat: its
// AgentConnected condition is no longer the Unknown of registration.
func agentHasConnected(c *clusterv1.Cluster) bool {
	for _, cond := range c.GetStatus().GetConditions() {
		if cond.Type == ConditionAgentConnected {
			return cond.Status != clusterv1.ConditionStatus_CONDITION_STATUS_UNKNOWN
		}
	}
	return false
}

func (p *pass) adopt(c *clusterv1.Cluster, origin *clusterv1.ImportOrigin) error {
	if _, err := p.l.s.store.Append(p.ctx, subjects.Cluster(c.Name), c.Id, events.At(c.Revision),
		&clusterv1.ClusterAdopted{Id: c.Id, Name: c.Name, Origin: origin}); err != nil {
		p.l.kick()
		return err
	}
	p.l.s.log.Info("cluster adopted", zap.String("cluster", c.Name), zap.String("policy", origin.Policy))
	return nil
}

// remove ends a lifecycle's hold on a cluster: a created cluster is deregistered, an adopted
// one stays, without the credentials this lifecycle attached (they were not there before it).
// Those go first: should the rest fail, the lifecycle is still on the cluster and the next pass
// retries.
func (p *pass) remove(o owner, reason string) {
	c, s := o.cluster, p.l.s
	rev := c.Revision
	if o.adopted && c.GetStatus().GetCredentialsFingerprint() != "" {
		sec, err := s.getSecretsSealed(p.ctx, c.Id)
		if err != nil {
			s.log.Warn("adopted cluster's credentials not read; retrying", zap.String("cluster", c.Name), zap.Error(err))
			p.l.kick()
			return
		}
		if sec.CredentialsImportOrigin != nil && sameOrigin(sec.CredentialsImportOrigin, o.origin) {
			seq, err := s.update(p.ctx, c, &clusterv1.UpdateClusterRequest{Name: c.Name}, []string{"credentials"}, nil)
			if err != nil {
				if !events.IsConflict(err) {
					s.log.Warn("credentials of an ended import not removed; retrying", zap.String("cluster", c.Name), zap.Error(err))
				}
				p.l.kick()
				return
			}
			s.log.Info("credentials attached by an ended import removed", zap.String("cluster", c.Name), zap.String("policy", o.origin.Policy))
			rev = seq
		}
	}
	seq, err := s.store.Append(p.ctx, subjects.Cluster(c.Name), c.Id, events.At(rev),
		&clusterv1.ImportedClusterRemoved{Id: c.Id, Name: c.Name, Origin: o.origin, Adopted: o.adopted, Reason: reason})
	if err == nil && !o.adopted {
		_, err = s.store.Append(p.ctx, subjects.Cluster(c.Name), c.Id, events.At(seq), &clusterv1.ClusterDeregistered{Id: c.Id})
		if err == nil {
			if secrets, err := s.getSecretsSealed(p.ctx, c.Id); err == nil {
				s.dropSecrets(secrets)
			}
		}
	}
	if err != nil {
		if !events.IsConflict(err) {
			s.log.Warn("imported cluster not removed; retrying", zap.String("cluster", c.Name), zap.Error(err))
		}
		p.l.kick()
		return
	}
	s.log.Info("import lifecycle ended", zap.String("cluster", c.Name), zap.String("policy", o.origin.Policy), zap.String("reason", reason), zap.Bool("adopted", o.adopted))
}

// writeWatches writes each inventory cluster's ImportWatch when it changed. An inventory
// cluster no policy names any more gets an empty one, so its agent stops watching.
func (l *lifecycles) writeWatches(ctx context.Context, watch map[string]*watchSet) {
	kv, err := l.s.js.KeyValue(ctx, subjects.ImportWatchBucket)
	if err != nil {
		l.s.log.Warn("import-watch bucket unavailable", zap.Error(err))
		return
	}
	l.mu.Lock()
	for cluster := range l.watchWritten {
		if _, ok := watch[cluster]; !ok {
			watch[cluster] = &watchSet{}
		}
	}
	l.mu.Unlock()
	for cluster, w := range watch {
		spec := &agentv1.ImportWatch{}
		for _, s := range w.sources {
			spec.Sources = append(spec.Sources, s)
		}
		for _, r := range w.refs {
			spec.References = append(spec.References, r)
		}
		slices.SortFunc(spec.Sources, func(a, b *agentv1.WatchedType) int {
			return strings.Compare(a.Group+"/"+a.Resource+"/"+a.Namespace, b.Group+"/"+b.Resource+"/"+b.Namespace)
		})
		slices.SortFunc(spec.References, func(a, b *agentv1.WatchedObject) int {
			return strings.Compare(a.Group+"/"+a.Resource+"/"+a.Namespace+"/"+a.Name, b.Group+"/"+b.Resource+"/"+b.Namespace+"/"+b.Name)
		})
		data, err := proto.MarshalOptions{Deterministic: true}.Marshal(spec)
		if err != nil {
			continue
		}
		key := subjects.ImportWatchKey(cluster)
		l.mu.Lock()
		prev, known := l.watchWritten[cluster]
		l.mu.Unlock()
		if !known {
			if e, err := kv.Get(ctx, key); err == nil {
				prev, known = e.Value(), true
			} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
				continue
			}
		}
		if known && proto.Equal(mustWatch(prev), spec) {
			l.mu.Lock()
			l.watchWritten[cluster] = data
			l.mu.Unlock()
			continue
		}
		if _, err := kv.Put(ctx, key, data); err != nil {
			l.s.log.Warn("import watch not written; retrying", zap.String("cluster", cluster), zap.Error(err))
			l.kick()
			continue
		}
		l.mu.Lock()
		l.watchWritten[cluster] = data
		l.mu.Unlock()
	}
}

func mustWatch(data []byte) *agentv1.ImportWatch {
	w := &agentv1.ImportWatch{}
	_ = proto.Unmarshal(data, w)
	return w
}

// list returns policy's lifecycles as the last pass left them.
func (l *lifecycles) list(policy string) []*clusterv1.ImportLifecycle {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*clusterv1.ImportLifecycle, len(l.status[policy]))
	for i, lc := range l.status[policy] {
		out[i] = proto.CloneOf(lc)
	}
	return out
}

func (a *ImportPolicyAPI) ListImportLifecycles(ctx context.Context, req *connect.Request[clusterv1.ListImportLifecyclesRequest]) (*connect.Response[clusterv1.ListImportLifecyclesResponse], error) {
	var v apierr.Violations
	v.DNSLabel("policy", req.Msg.Policy)
	if err := a.s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if _, ok := a.s.importPolicies.Get(importPolicyKey(req.Msg.Policy)); !ok {
		return nil, apierr.NotFound("import policy", req.Msg.Policy)
	}
	return connect.NewResponse(&clusterv1.ListImportLifecyclesResponse{Lifecycles: a.s.lifecycles.list(req.Msg.Policy)}), nil
}
