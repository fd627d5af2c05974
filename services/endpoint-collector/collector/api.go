package collector

import (
	"context"
	"net/netip"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
	"github.com/fleetstream/fleetstream/pkg/authz"
	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
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
	sn := c.store.snapshot(serviceKey(m.Namespace, m.Name))
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
	key := serviceKey(m.Namespace, m.Name)
	w := c.store.hub.add(key)
	defer c.store.hub.remove(key, w)
	var (
		sent    bool
		version uint64
	)
	send := func() error {
		sn := c.store.snapshot(key)
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
		if err := send(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.ch:
		}
	}
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
	if m.Clear {
		seq, err = c.events.Append(ctx, subject, agg, events.Any, &endpointv1.EndpointWeightCleared{
			Namespace: m.Namespace, Name: m.Name, Ip: ipText, ClusterName: m.Cluster, Reason: "reset"})
	} else {
		bindings := c.bindings(serviceKey(m.Namespace, m.Name), ip, m.Cluster)
		if len(bindings) == 0 {
			where := ""
			if m.Cluster != "" {
				where = " in cluster " + m.Cluster
			}
			return nil, apierr.NotFoundf("service %s/%s has no endpoint %s%s",
				m.Namespace, m.Name, ipText, where)
		}
		seq, err = c.events.Append(ctx, subject, agg, events.Any, &endpointv1.EndpointWeightSet{
			Namespace: m.Namespace, Name: m.Name, Ip: ipText, Weight: m.Weight, Bindings: bindings})
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
	return connect.NewResponse(&endpointv1.SetEndpointWeightResponse{Weights: w}), nil
}

// bindings finds the endpoints with ip in the service now, per cluster (only cluster if set):
// the weight is bound to the object behind each, so a later pod with the same IP starts at 100.
func (c *Collector) bindings(key string, ip netip.Addr, cluster string) []*endpointv1.WeightBinding {
	sn := c.store.snapshot(key)
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
	// cluster before it joins is how a canary starts.
	seq, err := c.events.Append(ctx, subjects.EndpointWeight(m.Namespace, m.Name), viewKey(m.Namespace, m.Name), events.Any,
		&endpointv1.ClusterWeightSet{Namespace: m.Namespace, Name: m.Name, ClusterName: m.Cluster, Weight: m.Weight})
	if err != nil {
		return nil, apierr.Internal(err)
	}
	w, err := c.awaitWeights(ctx, m.Namespace, m.Name, seq)
	if err != nil {
		return nil, err
	}
	c.log.Info("cluster weight set", zap.String("service", m.Namespace+"/"+m.Name), zap.String("cluster", m.Cluster),
		zap.Uint32("weight", m.Weight), zap.String("actor", identity.ActorFrom(ctx)))
	return connect.NewResponse(&endpointv1.SetClusterWeightResponse{Weights: w}), nil
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

// waitSnapshot blocks until cond holds for service key's snapshot (nil when it has none).
func (c *Collector) waitSnapshot(ctx context.Context, key string, cond func(*snapshot) bool) error {
	w := c.store.hub.add(key)
	defer c.store.hub.remove(key, w)
	for !cond(c.store.snapshot(key)) {
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
	snaps := c.store.Services(func(sns, _ string) bool {
		return (ns == "" || sns == ns) && caller.CanInNamespace("list", roles.Group, roles.ResServices, "", sns)
	})
	out := &endpointv1.ListServicesResponse{Services: make([]*endpointv1.ServiceSummary, 0, len(snaps))}
	for _, sn := range snaps {
		sns, name := sn.names()
		s := &endpointv1.ServiceSummary{Namespace: sns, Name: name, ReadyEndpoints: sn.ready(), TotalEndpoints: sn.total()}
		for i := range sn.clusters {
			s.Clusters = append(s.Clusters, sn.clusters[i].name())
		}
		out.Services = append(out.Services, s)
	}
	return connect.NewResponse(out), nil
}
