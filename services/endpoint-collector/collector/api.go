package collector

import (
	"cmp"
	"context"
	"net/netip"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/roles"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// MaxWeight is the largest weight; 100 is the default and 0 drains.
const MaxWeight = 0xFFFF

func validateService(v *apierr.Violations, ns, name string) {
	v.DNSLabel("namespace", ns)
	v.DNSLabel("name", name)
}

func validateQuery(v *apierr.Violations, filter endpointv1.EndpointFilter, portName string) {
	if _, ok := endpointv1.EndpointFilter_name[int32(filter)]; !ok {
		v.Add("filter", "unknown filter %d (READY, READY_OR_TERMINATING or ALL)", filter)
	}
	if portName != "" {
		v.DNSLabel("port_name", portName)
	}
}

func validateWeight(v *apierr.Violations, w uint32) {
	if w > MaxWeight {
		v.Add("weight", "%d is out of range 0..%d (100 is the default, 0 drains)", w, MaxWeight)
	}
}

func (c *Collector) GetServiceEndpoints(ctx context.Context, req *connect.Request[endpointv1.GetServiceEndpointsRequest]) (*connect.Response[endpointv1.GetServiceEndpointsResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateService(&v, m.Namespace, m.Name)
	validateQuery(&v, m.Filter, m.PortName)
	if err := c.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	sn, _ := c.viewOf(ctx, "get", roles.ResServices, m.Namespace, m.Name)
	if sn == nil {
		return nil, apierr.NotFound("service", m.Namespace+"/"+m.Name)
	}
	return connect.NewResponse(sn.response(c.env, m.Filter, m.PortName)), nil
}

func (c *Collector) WatchServiceEndpoints(ctx context.Context, req *connect.Request[endpointv1.WatchServiceEndpointsRequest], stream *connect.ServerStream[endpointv1.WatchServiceEndpointsResponse]) error {
	m := req.Msg
	var v apierr.Violations
	validateService(&v, m.Namespace, m.Name)
	validateQuery(&v, m.Filter, m.PortName)
	if err := c.gate.Admit(ctx, &v); err != nil {
		return err
	}
	var (
		key     string
		w       *watcher
		sent    bool
		version uint64
	)
	defer func() {
		if w != nil {
			c.store.hub.remove(key, w)
		}
	}()
	send := func(sn *snapshot) error {
		switch {
		case sn == nil && (!sent || version != 0):
			version = 0
			sent = true
			return stream.Send(&endpointv1.WatchServiceEndpointsResponse{Namespace: m.Namespace, Name: m.Name})
		case sn != nil && (!sent || sn.version != version):
			version = sn.version
			sent = true
			r := sn.response(c.env, m.Filter, m.PortName)
			return stream.Send(&endpointv1.WatchServiceEndpointsResponse{Namespace: m.Namespace, Name: m.Name, Exists: true,
				Clusters: r.Clusters, Version: r.Version})
		}
		return nil
	}
	for {
		// What the caller reads may move to another key when ownership changes (the service
		// then stops being served under the old one, which wakes this watcher).
		sn, k := c.viewOf(ctx, "watch", roles.ResServices, m.Namespace, m.Name)
		if k != key {
			if w != nil {
				c.store.hub.remove(key, w)
			}
			key, w = k, c.store.hub.add(k)
			sn, _ = c.viewOf(ctx, "watch", roles.ResServices, m.Namespace, m.Name) // a change before add is not missed
		}
		if err := send(sn); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.ch:
		}
	}
}

// viewOf returns what the caller of ctx reads as service ns/name, and the key whose watchers
// are told when it changes (docs/endpoints.md, "Who owns a service's endpoints"):
//   - in a namespace no project owns, the service merged across every cluster;
//   - for a platform admin, the service's whole state: every cluster, those where no project
//     owns the namespace included;
//   - otherwise the view of the project owning the namespace in which the caller may do verb on
//     resource, or, when it may in several, one merging their clusters (built for the call,
//     not cached).
//
// nil when there is nothing the caller may read.
func (c *Collector) viewOf(ctx context.Context, verb, resource, ns, name string) (*snapshot, string) {
	key := serviceKey(ns, name)
	o := c.owning(ns)
	if o == nil {
		return c.store.snapshot(key), key
	}
	caller := authz.CallerFrom(ctx)
	if caller.Admin() {
		return c.store.state(key), key
	}
	projects := caller.CanInOwningProject(verb, roles.Group, resource, ns)
	switch len(projects) {
	case 0:
		return nil, key
	case 1:
		vk := projectKey(key, projects[0])
		return c.store.snapshot(vk), vk
	}
	st := c.store.state(key)
	if st == nil {
		return nil, key
	}
	var parts []part
	for _, cs := range st.parts() {
		if slices.Contains(projects, o.of(cs.name())) {
			parts = append(parts, cs.part)
		}
	}
	if len(parts) == 0 {
		return nil, key
	}
	slices.SortFunc(parts, func(a, b part) int { return cmp.Compare(a.ref().info.name, b.ref().info.name) })
	u := c.assemble(st.key, parts, c.weightsOf(ns, name))
	u.version = st.version
	u.resp.Store(releasedSlots) // built for this call: nothing is cached in it
	return u, key
}

func (c *Collector) SetEndpointWeight(ctx context.Context, req *connect.Request[endpointv1.SetEndpointWeightRequest]) (*connect.Response[endpointv1.SetEndpointWeightResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateService(&v, m.Namespace, m.Name)
	ip, err := netip.ParseAddr(m.Ip)
	switch {
	case m.Ip == "":
		v.Add("ip", "required")
	case err != nil || ip.Zone() != "":
		v.Add("ip", "%q is not an IP address", m.Ip)
	}
	if !m.Clear {
		validateWeight(&v, m.Weight)
	}
	if m.Cluster != "" {
		v.DNSLabel("cluster", m.Cluster)
	}
	if err := c.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	ipText := ip.Unmap().String() // one spelling per address, whatever the caller typed
	subject := subjects.EndpointWeight(m.Namespace, m.Name)
	agg := viewKey(m.Namespace, m.Name)
	var seq uint64
	// No events.Command: a weight is set per address, the last write wins, and nothing here is
	// decided from the weights view's state that a concurrent write could make stale.
	var decided []proto.Message
	if m.Clear {
		clusters := []string{m.Cluster}
		if m.Cluster == "" {
			if cl, scoped := c.clearScope(ctx, m.Namespace, m.Name, ipText); scoped {
				clusters = cl
			}
		}
		for _, cl := range clusters {
			decided = append(decided, &endpointv1.EndpointWeightCleared{
				Namespace: m.Namespace, Name: m.Name, Ip: ipText, ClusterName: cl, Reason: "reset"})
		}
	} else {
		// A weight naming a cluster binds there (the caller owns the namespace there, or is a
		// platform admin); one naming none, in every cluster of the service the caller reads.
		sn, _ := c.viewOf(ctx, "update", roles.ResServiceWeights, m.Namespace, m.Name)
		if m.Cluster != "" {
			sn = c.store.state(serviceKey(m.Namespace, m.Name))
		}
		bindings := c.bindings(sn, ip, m.Cluster)
		if len(bindings) == 0 {
			where := ""
			if m.Cluster != "" {
				where = " in cluster " + m.Cluster
			}
			return nil, apierr.NotFoundf("service %s/%s has no endpoint %s%s",
				m.Namespace, m.Name, ipText, where)
		}
		decided = append(decided, &endpointv1.EndpointWeightSet{
			Namespace: m.Namespace, Name: m.Name, Ip: ipText, Weight: m.Weight, Bindings: bindings})
	}
	if m.DryRun {
		return connect.NewResponse(&endpointv1.SetEndpointWeightResponse{Weights: visibleWeights(authz.CallerFrom(ctx), c.weightsAfter(m.Namespace, m.Name, decided))}), nil
	}
	for _, ev := range decided {
		if seq, err = c.events.Append(ctx, subject, agg, events.Any, ev); err != nil {
			break
		}
	}
	if err != nil {
		return nil, apierr.Internal(err)
	}
	w, err := c.awaitWeights(ctx, m.Namespace, m.Name, seq)
	if err != nil {
		return nil, err
	}
	c.log.Info("endpoint weight set", zap.String("service", m.Namespace+"/"+m.Name), zap.String("ip", ipText),
		zap.Uint32("weight", m.Weight), zap.Bool("reset", m.Clear), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&endpointv1.SetEndpointWeightResponse{Weights: visibleWeights(authz.CallerFrom(ctx), w)}), nil
}

// weightsAfter is a dry run's answer: the service's weights as the view would fold evs into
// them (its own code), nothing appended.
func (c *Collector) weightsAfter(ns, name string, evs []proto.Message) *endpointv1.ServiceWeights {
	var state proto.Message
	if w := c.weightsOf(ns, name); w != nil {
		state = proto.CloneOf(w)
	}
	now := timestamppb.Now()
	for _, ev := range evs {
		changes, err := applyWeights(&events.Event{Envelope: &eventv1.Envelope{Time: now}, Subject: subjects.EndpointWeight(ns, name), Payload: ev})
		if err != nil || len(changes) != 1 {
			continue
		}
		state = changes[0].Update(state)
	}
	if w, ok := state.(*endpointv1.ServiceWeights); ok && w != nil {
		return w
	}
	return &endpointv1.ServiceWeights{Namespace: ns, Name: name}
}

// clearScope returns the clusters where a reset of ip's weight naming no cluster applies when
// the caller is not a platform admin and the namespace is owned: those of its projects' service
// that have a weight for ip, not the other projects' (false: every cluster, as the event says).
func (c *Collector) clearScope(ctx context.Context, ns, name, ip string) ([]string, bool) {
	o := c.owning(ns)
	caller := authz.CallerFrom(ctx)
	if o == nil || caller.Admin() {
		return nil, false
	}
	projects := caller.CanInOwningProject("update", roles.Group, roles.ResServiceWeights, ns)
	var out []string
	if w := c.weightsOf(ns, name); w != nil {
		for _, ew := range w.EndpointWeights {
			if ew.Ip == ip && slices.Contains(projects, o.of(ew.ClusterName)) && !slices.Contains(out, ew.ClusterName) {
				out = append(out, ew.ClusterName)
			}
		}
	}
	return out, true
}

// bindings finds the endpoints with ip in service snapshot sn, per cluster (only cluster if
// set): the weight is bound to the object behind each, so a later pod with the same IP starts
// at 100.
func (c *Collector) bindings(sn *snapshot, ip netip.Addr, cluster string) []*endpointv1.WeightBinding {
	if sn == nil {
		return nil
	}
	addr, _ := addrBytes(ip)
	var out []*endpointv1.WeightBinding
	for ci := range sn.clusters {
		cs := &sn.clusters[ci]
		if cluster != "" && cs.name() != cluster {
			continue
		}
		var best *endpoint
		for si := range cs.nslices() {
			s := cs.slice(si)
			for i := range s.n() {
				if e := s.ep(i); e.addr == addr && (best == nil || e.rank() > best.rank()) {
					best = &e
				}
			}
		}
		if best == nil {
			continue
		}
		b := &endpointv1.WeightBinding{ClusterName: cs.name(), ClusterId: cs.clusterID()}
		if best.flags&fHasUID != 0 {
			b.TargetUid = uuid.UUID(best.uid).String()
		}
		out = append(out, b)
	}
	return out
}

func (c *Collector) SetClusterWeight(ctx context.Context, req *connect.Request[endpointv1.SetClusterWeightRequest]) (*connect.Response[endpointv1.SetClusterWeightResponse], error) {
	m := req.Msg
	var v apierr.Violations
	validateService(&v, m.Namespace, m.Name)
	v.DNSLabel("cluster", m.Cluster)
	validateWeight(&v, m.Weight)
	if err := c.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	// Neither the service nor the cluster has to serve endpoints yet: draining or weighting a
	// cluster before it joins is how a canary starts. No events.Command: the last write wins.
	ev := &endpointv1.ClusterWeightSet{Namespace: m.Namespace, Name: m.Name, ClusterName: m.Cluster, Weight: m.Weight}
	if m.DryRun {
		return connect.NewResponse(&endpointv1.SetClusterWeightResponse{Weights: visibleWeights(authz.CallerFrom(ctx), c.weightsAfter(m.Namespace, m.Name, []proto.Message{ev}))}), nil
	}
	seq, err := c.events.Append(ctx, subjects.EndpointWeight(m.Namespace, m.Name), viewKey(m.Namespace, m.Name), events.Any, ev)
	if err != nil {
		return nil, apierr.Internal(err)
	}
	w, err := c.awaitWeights(ctx, m.Namespace, m.Name, seq)
	if err != nil {
		return nil, err
	}
	c.log.Info("cluster weight set", zap.String("service", m.Namespace+"/"+m.Name), zap.String("cluster", m.Cluster),
		zap.Uint32("weight", m.Weight), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&endpointv1.SetClusterWeightResponse{Weights: visibleWeights(authz.CallerFrom(ctx), w)}), nil
}

// awaitWeights waits until the weight event at seq is in the weights view and in the service's
// served snapshot, so that a GetServiceEndpoints after the call sees it, and returns the weights.
func (c *Collector) awaitWeights(ctx context.Context, ns, name string, seq uint64) (*endpointv1.ServiceWeights, error) {
	ctx, cancel := context.WithTimeout(ctx, apiwait.Patience)
	defer cancel()
	unavailable := func(err error) error {
		return apierr.NotYetVisible("weight", err)
	}
	if err := c.weightsView.WaitApplied(ctx, seq); err != nil {
		return nil, unavailable(err)
	}
	// The engine has written the bucket; wait for the cache to hold the same. An entry that the
	// event emptied is deleted, and a later event may already have replaced it.
	vk := viewKey(ns, name)
	if err := c.weights.WaitFor(ctx, vk, func(w *endpointv1.ServiceWeights, ok bool) bool {
		return (ok && w.Revision >= seq) || (!ok && c.weightsView.Applied() >= seq && c.kvAbsent(ctx, vk))
	}); err != nil {
		return nil, unavailable(err)
	}
	w, ok := c.weights.Get(vk)
	var want uint64
	if ok {
		want = w.Revision
	} else {
		w = &endpointv1.ServiceWeights{Namespace: ns, Name: name}
	}
	key := serviceKey(ns, name)
	if err := c.waitSnapshot(ctx, key, func(sn *snapshot) bool {
		if sn == nil {
			return true
		}
		rev := sn.weightsRev()
		return rev >= want && (want > 0 || rev == 0 || rev > seq)
	}); err != nil {
		return nil, unavailable(err)
	}
	return w, nil
}

// kvAbsent reports whether the weights bucket has no entry at key (the cache may lag a delete).
func (c *Collector) kvAbsent(ctx context.Context, key string) bool {
	kv, err := c.js.KeyValue(ctx, subjects.EndpointWeightsBucket)
	if err != nil {
		return false
	}
	_, err = kv.Get(ctx, key)
	return err != nil
}

// waitSnapshot blocks until cond holds for service key's state (nil when it has none); in an
// owned namespace its views are published before it.
func (c *Collector) waitSnapshot(ctx context.Context, key string, cond func(*snapshot) bool) error {
	w := c.store.hub.add(key)
	defer c.store.hub.remove(key, w)
	for !cond(c.store.state(key)) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w.ch:
		}
	}
	return nil
}

func (c *Collector) ListServices(ctx context.Context, req *connect.Request[endpointv1.ListServicesRequest]) (*connect.Response[endpointv1.ListServicesResponse], error) {
	var v apierr.Violations
	if req.Msg.Namespace != "" {
		v.DNSLabel("namespace", req.Msg.Namespace)
	}
	if err := c.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	ns := req.Msg.Namespace
	caller := authz.CallerFrom(ctx)
	// As viewOf reads: a platform admin sees each service whole, others the views of the
	// projects they may list services in (merged when several own one service).
	admin := caller.Admin()
	snaps := c.store.list(admin, func(key string) bool {
		sns, _, project := splitKey(key)
		if ns != "" && sns != ns {
			return false
		}
		switch {
		case admin:
			return true
		case project == "":
			return caller.CanInNamespace("list", roles.Group, roles.ResServices, "", sns)
		}
		return caller.Can("list", roles.Group, roles.ResServices, project)
	})
	out := &endpointv1.ListServicesResponse{Services: make([]*endpointv1.ServiceSummary, 0, len(snaps))}
	var last *endpointv1.ServiceSummary
	for _, sn := range snaps {
		sns, name := sn.names()
		s := last
		if s == nil || s.Namespace != sns || s.Name != name {
			s = &endpointv1.ServiceSummary{Namespace: sns, Name: name}
			out.Services = append(out.Services, s)
			last = s
		}
		s.ReadyEndpoints += sn.ready()
		s.TotalEndpoints += sn.total()
		for i := range sn.clusters {
			s.Clusters = append(s.Clusters, sn.clusters[i].name())
		}
		slices.Sort(s.Clusters)
	}
	return connect.NewResponse(out), nil
}

func (c *Collector) ListServiceWeights(ctx context.Context, req *connect.Request[endpointv1.ListServiceWeightsRequest]) (*connect.Response[endpointv1.ListServiceWeightsResponse], error) {
	var v apierr.Violations
	if req.Msg.Namespace != "" {
		v.DNSLabel("namespace", req.Msg.Namespace)
	}
	if err := c.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	ns := req.Msg.Namespace
	caller := authz.CallerFrom(ctx)
	all := c.weights.List(func(_ string, w *endpointv1.ServiceWeights) bool { return ns == "" || w.Namespace == ns })
	out := &endpointv1.ListServiceWeightsResponse{Weights: make([]*endpointv1.ServiceWeights, 0, len(all))}
	for _, w := range all {
		if w = visibleWeights(caller, w); len(w.ClusterWeights) > 0 || len(w.EndpointWeights) > 0 {
			out.Weights = append(out.Weights, w)
		}
	}
	slices.SortFunc(out.Weights, func(a, b *endpointv1.ServiceWeights) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return connect.NewResponse(out), nil
}

// visibleWeights is what caller may read of a service's weights: a weight is the business of
// the project owning the service's namespace in its cluster (SetClusterWeight's rule), so others
// see only the clusters where they may read the service, and not the revision either (it would
// say when another project changed its weights). Platform admins read w whole; w itself, a
// cache's value, is never modified.
func visibleWeights(caller *authz.Caller, w *endpointv1.ServiceWeights) *endpointv1.ServiceWeights {
	if w == nil || caller.Admin() {
		return w
	}
	visible := func(cluster string) bool {
		return caller.CanInNamespace("list", roles.Group, roles.ResServices, cluster, w.Namespace)
	}
	out := &endpointv1.ServiceWeights{Namespace: w.Namespace, Name: w.Name}
	for cluster, weight := range w.ClusterWeights {
		if visible(cluster) {
			if out.ClusterWeights == nil {
				out.ClusterWeights = map[string]uint32{}
			}
			out.ClusterWeights[cluster] = weight
		}
	}
	for _, e := range w.EndpointWeights {
		if visible(e.ClusterName) {
			out.EndpointWeights = append(out.EndpointWeights, proto.Clone(e).(*endpointv1.EndpointWeight))
		}
	}
	return out
}
