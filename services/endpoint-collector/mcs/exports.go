package mcs

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/validation"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/mcs"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// nsReport is the last accepted report of one namespace of one cluster.
type nsReport struct {
	session string
	exports map[string]Export // by service name
	// omitted is how many exports the agent left out of the report (its bounds).
	omitted uint32
}

// exportStore holds every cluster's reported exports, as the agents last reported them.
type exportStore struct {
	mu       sync.Mutex
	clusters map[string]map[string]*nsReport // cluster → namespace → report
	// exporters indexes the clusters exporting each service (namespace/name), so that a
	// service's exports and "is it exported" cost the exporters, not the fleet.
	exporters map[string]map[string]bool
	// refused is, by cluster, the namespaces whose last report was refused, and the session
	// of that report (a relist of another session that does not report them again clears it).
	refused map[string]map[string]string
	// unbound is, by cluster, the namespaces whose last valid report was dropped because no
	// project has bound the namespace there (bound said so): only their names, so that a
	// binding made later re-reads their last report from the stream (service.go, rebind).
	unbound map[string]map[string]string // cluster → namespace → session of the report
	// overflow counts, by cluster, the namespaces whose reports were refused because the
	// cluster already had maxNamespaces namespaces held; a relist of the agent resets it.
	overflow map[string]int

	// bound reports whether a project has bound namespace ns on cluster; nil: every one is.
	bound func(cluster, ns string) bool
	// maxNamespaces bounds the namespaces held per cluster, reports, unbound and refused ones
	// together: a compromised agent costs the hub at most that, whatever it sends.
	maxNamespaces int
}

// DefaultMaxExportNamespacesPerCluster is the most namespaces whose export reports the hub
// holds per cluster: Kubernetes' own scalability threshold is 10,000 namespaces a cluster.
const DefaultMaxExportNamespacesPerCluster = 10_000

func newExportStore() *exportStore {
	return &exportStore{clusters: map[string]map[string]*nsReport{}, exporters: map[string]map[string]bool{}, refused: map[string]map[string]string{},
		unbound: map[string]map[string]string{}, overflow: map[string]int{}, maxNamespaces: DefaultMaxExportNamespacesPerCluster}
}

// heldLocked is how many namespaces of cluster the store holds anything of.
func (s *exportStore) heldLocked(cluster string) int {
	return len(s.clusters[cluster]) + len(s.unbound[cluster]) + len(s.refused[cluster])
}

// holdsLocked reports whether the store holds anything of cluster's namespace ns.
func (s *exportStore) holdsLocked(cluster, ns string) bool {
	_, r := s.clusters[cluster][ns]
	_, f := s.refused[cluster][ns]
	_, u := s.unbound[cluster][ns]
	return r || f || u
}

// admit reports whether a report of cluster's namespace ns may be held: the namespace is
// bound there (the hub's bindings bound those), the store holds it already, or the cluster is
// under maxNamespaces. Otherwise it counts the overflow: a flood of unbound namespaces' names
// costs at most maxNamespaces per cluster, and never keeps a bound namespace's report out.
func (s *exportStore) admit(cluster, ns string) bool {
	bound := s.bound == nil || s.bound(cluster, ns)
	s.mu.Lock()
	defer s.mu.Unlock()
	if bound || s.holdsLocked(cluster, ns) || s.heldLocked(cluster) < s.maxNamespaces {
		return true
	}
	s.overflow[cluster]++
	return false
}

// setUnbound records (or with false forgets) that cluster's report of ns (of session) was
// dropped as not bound.
func (s *exportStore) setUnbound(cluster, ns, session string, unbound bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !unbound {
		delete(s.unbound[cluster], ns)
		if len(s.unbound[cluster]) == 0 {
			delete(s.unbound, cluster)
		}
		return
	}
	if s.unbound[cluster] == nil {
		s.unbound[cluster] = map[string]string{}
	}
	s.unbound[cluster][ns] = session
}

// unboundAll returns the namespaces whose reports were dropped as not bound, by cluster.
func (s *exportStore) unboundAll() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]string{}
	for c, nss := range s.unbound {
		for ns := range nss {
			out[c] = append(out[c], ns)
		}
	}
	return out
}

// heldAll returns the namespaces with a held report, by cluster.
func (s *exportStore) heldAll() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]string{}
	for c, nss := range s.clusters {
		for ns := range nss {
			out[c] = append(out[c], ns)
		}
	}
	return out
}

// index moves cluster's entries of ns in exporters from old's exports to r's.
func (s *exportStore) index(cluster, ns string, old, r *nsReport) {
	if old != nil {
		for name := range old.exports {
			k := ns + "/" + name
			delete(s.exporters[k], cluster)
			if len(s.exporters[k]) == 0 {
				delete(s.exporters, k)
			}
		}
	}
	if r != nil {
		for name := range r.exports {
			k := ns + "/" + name
			if s.exporters[k] == nil {
				s.exporters[k] = map[string]bool{}
			}
			s.exporters[k][cluster] = true
		}
	}
}

// errRefused marks a report the hub does not take: what an agent that bounds and validates as
// its own code does never sends.
var errRefused = errors.New("refused")

// handle applies one message of subject; it returns the service keys (namespace/name) whose
// exports changed. A report that fails validation is refused whole (the namespace's exports
// of that cluster are dropped, as if it had reported none) with an error naming the field.
func (s *exportStore) handle(subject string, data []byte) ([]string, error) {
	toks := strings.Split(subject, ".")
	// fleet.agent.<cluster>.serviceexports.<ns> | fleet.agent.<cluster>.serviceexportsync
	if len(toks) < 4 {
		return nil, fmt.Errorf("%w: subject %s", errRefused, subject)
	}
	cluster, err := keys.Decode(toks[2])
	if err != nil {
		return nil, fmt.Errorf("%w: subject %s: %v", errRefused, subject, err)
	}
	env := &eventv1.Envelope{}
	if err := proto.Unmarshal(data, env); err != nil {
		return nil, fmt.Errorf("%w: subject %s: envelope: %v", errRefused, subject, err)
	}
	switch {
	case len(toks) == 4 && subject == subjects.AgentServiceExportsSync(cluster):
		m := &endpointv1.ServiceExportsSync{}
		if err := env.GetPayload().UnmarshalTo(m); err != nil {
			return nil, fmt.Errorf("%w: subject %s: payload: %v", errRefused, subject, err)
		}
		return s.sync(cluster, m.GetSessionId()), nil
	case len(toks) == 5 && toks[3] == subjects.AgentServiceExportsKind:
		ns, err := keys.Decode(toks[4])
		if err != nil {
			return nil, fmt.Errorf("%w: subject %s: %v", errRefused, subject, err)
		}
		if !s.admit(cluster, ns) {
			return nil, fmt.Errorf("%w: cluster %s namespace %s: not bound there, and the hub already holds %d namespaces of the cluster, at most", errRefused, cluster, ns, s.maxNamespaces)
		}
		m := &endpointv1.ServiceExportsReport{}
		if err := env.GetPayload().UnmarshalTo(m); err != nil {
			s.setUnbound(cluster, ns, "", false)
			s.refuse(cluster, ns, "")
			return s.replace(cluster, ns, nil), fmt.Errorf("%w: subject %s: payload: %v", errRefused, subject, err)
		}
		r, err := validate(cluster, ns, m)
		if err != nil {
			s.setUnbound(cluster, ns, "", false)
			s.refuse(cluster, ns, m.GetSessionId())
			return s.replace(cluster, ns, nil), fmt.Errorf("%w: cluster %s namespace %s: %v", errRefused, cluster, ns, err)
		}
		s.refuse(cluster, ns, "\x00accepted")
		// A namespace no project has bound on the cluster exports nothing (Compute): its
		// report is not held, only its name, for a binding made later to re-read it.
		unbound := s.bound != nil && !s.bound(cluster, ns)
		s.setUnbound(cluster, ns, r.session, unbound && (len(r.exports) > 0 || r.omitted > 0))
		if unbound {
			return s.replace(cluster, ns, nil), nil
		}
		return s.replace(cluster, ns, r), nil
	}
	return nil, fmt.Errorf("%w: subject %s", errRefused, subject)
}

// validate checks a report against what the agent's own bounds and Kubernetes allow.
func validate(cluster, ns string, m *endpointv1.ServiceExportsReport) (*nsReport, error) {
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return nil, fmt.Errorf("namespace: %s", strings.Join(errs, "; "))
	}
	if m.GetNamespace() != ns {
		return nil, fmt.Errorf("namespace: the report names %q, its subject another", m.GetNamespace())
	}
	if m.GetClusterName() != cluster {
		return nil, fmt.Errorf("cluster_name: the report names another cluster than its subject")
	}
	if n := len(m.GetExports()); n > mcs.MaxExportsPerReport {
		return nil, fmt.Errorf("exports: %d, at most %d", n, mcs.MaxExportsPerReport)
	}
	if n := proto.Size(m); n > mcs.MaxReportBytes+1024 {
		return nil, fmt.Errorf("report: %d bytes, at most %d", n, mcs.MaxReportBytes)
	}
	r := &nsReport{session: m.GetSessionId(), exports: map[string]Export{}, omitted: m.GetOmitted()}
	for i, e := range m.GetExports() {
		path := fmt.Sprintf("exports[%d]", i)
		if err := mcs.ValidateExport(e); err != nil {
			return nil, fmt.Errorf("%s.%w", path, err)
		}
		if _, dup := r.exports[e.GetName()]; dup {
			return nil, fmt.Errorf("%s.name: %s is reported twice", path, e.GetName())
		}
		x := Export{Cluster: cluster, Created: e.GetCreated().AsTime(), Type: e.GetType()}
		for _, p := range e.GetPorts() {
			x.Ports = append(x.Ports, Port{Name: p.GetName(), Protocol: p.GetProtocol(), AppProtocol: p.GetAppProtocol(), Port: int32(p.GetPort())})
		}
		r.exports[e.GetName()] = x
	}
	return r, nil
}

// refuse records that cluster's report of ns was refused (in session), or with session
// "\x00accepted" that it was not.
func (s *exportStore) refuse(cluster, ns, session string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if session == "\x00accepted" {
		delete(s.refused[cluster], ns)
		if len(s.refused[cluster]) == 0 {
			delete(s.refused, cluster)
		}
		return
	}
	if s.refused[cluster] == nil {
		s.refused[cluster] = map[string]string{}
	}
	s.refused[cluster][ns] = session
}

// Reasons of the AgentWithinLimits condition the hub shows for a cluster's export reports.
const (
	ReasonInvalidServiceExports = "InvalidServiceExports"
	ReasonServiceExportsOmitted = "ServiceExportsOmitted"
)

// limits returns why cluster's agent is not within its export reports' limits: the reason and
// a message naming counts and bounds, never what the agent sent; "" when it is within them.
func (s *exportStore) limits(cluster string) (reason, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.refused[cluster]) + s.overflow[cluster]; n > 0 {
		return ReasonInvalidServiceExports, fmt.Sprintf("the ServiceExport reports of %d namespace(s) were refused as invalid or past their bounds (the hub's log names the fields): their exports are not imported", n)
	}
	var omitted uint32
	for _, r := range s.clusters[cluster] {
		omitted += r.omitted
	}
	if omitted > 0 {
		return ReasonServiceExportsOmitted, fmt.Sprintf("%d ServiceExport(s) left out of reports past %d per namespace: they are not exported", omitted, mcs.MaxExportsPerReport)
	}
	return "", ""
}

// replace sets cluster's report of ns (nil: none) and returns the services that changed.
func (s *exportStore) replace(cluster, ns string, r *nsReport) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	byNS := s.clusters[cluster]
	var old *nsReport
	if byNS != nil {
		old = byNS[ns]
	}
	changed := map[string]bool{}
	if old != nil {
		for name := range old.exports {
			changed[name] = true
		}
	}
	if r != nil {
		for name := range r.exports {
			changed[name] = true
		}
	}
	s.index(cluster, ns, old, r)
	switch {
	case r == nil || (len(r.exports) == 0 && r.omitted == 0):
		if byNS != nil {
			delete(byNS, ns)
			if len(byNS) == 0 {
				delete(s.clusters, cluster)
			}
		}
	default:
		if byNS == nil {
			byNS = map[string]*nsReport{}
			s.clusters[cluster] = byNS
		}
		byNS[ns] = r
	}
	out := make([]string, 0, len(changed))
	for name := range changed {
		out = append(out, ns+"/"+name)
	}
	return out
}

// sync drops cluster's reports of sessions other than session: the agent reported every
// namespace with exports since, so the others have none.
func (s *exportStore) sync(cluster, session string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for ns, r := range s.clusters[cluster] {
		if r.session == session {
			continue
		}
		for name := range r.exports {
			out = append(out, ns+"/"+name)
		}
		s.index(cluster, ns, r, nil)
		delete(s.clusters[cluster], ns)
	}
	if len(s.clusters[cluster]) == 0 {
		delete(s.clusters, cluster)
	}
	delete(s.overflow, cluster)
	for ns, sess := range s.unbound[cluster] {
		if sess != session {
			delete(s.unbound[cluster], ns)
		}
	}
	if len(s.unbound[cluster]) == 0 {
		delete(s.unbound, cluster)
	}
	for ns, sess := range s.refused[cluster] {
		if sess != session {
			delete(s.refused[cluster], ns)
		}
	}
	if len(s.refused[cluster]) == 0 {
		delete(s.refused, cluster)
	}
	return out
}

// of returns the exports of service ns/name, by cluster.
func (s *exportStore) of(ns, name string) map[string]Export {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]Export{}
	for cluster := range s.exporters[ns+"/"+name] {
		out[cluster] = s.clusters[cluster][ns].exports[name]
	}
	return out
}

// exported reports whether any cluster exports service key (namespace/name).
func (s *exportStore) exported(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.exporters[key]) > 0
}

// keys returns every exported service key.
func (s *exportStore) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.exporters))
	for k := range s.exporters {
		out = append(out, k)
	}
	return out
}

// omitted returns how many exports cluster's agent left out of its reports.
func (s *exportStore) omitted(cluster string) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n uint32
	for _, r := range s.clusters[cluster] {
		n += r.omitted
	}
	return n
}

// unbind drops the held reports of the namespaces no longer bound on their cluster (keeping
// their names, as handle does) and returns the services that changed.
func (s *exportStore) unbind() []string {
	if s.bound == nil {
		return nil
	}
	var out []string
	for cluster, nss := range s.heldAll() {
		for _, ns := range nss {
			if s.bound(cluster, ns) {
				continue
			}
			s.mu.Lock()
			r := s.clusters[cluster][ns]
			s.mu.Unlock()
			if r == nil {
				continue
			}
			s.setUnbound(cluster, ns, r.session, true)
			out = append(out, s.replace(cluster, ns, nil)...)
		}
	}
	return out
}
