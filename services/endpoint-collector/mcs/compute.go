// Package mcs is the hub side of multi-cluster Services (KEP-1645, docs/kubernetes.md): from the
// ServiceExports agents report and the endpoints the collector holds, it computes for every
// (namespace, service) and every member cluster where the namespace is bound to the exporting
// project the ServiceImport and the EndpointSlices (one set per source cluster) to apply there,
// resolves conflicts as KEP-1645 says (the oldest export wins) and writes the result as desired
// state into bucket desired-mcs, which the clusters' agents apply like RoleBindings.
//
// It lives in endpoint-collector because the collector already holds every cluster's endpoints
// per service, merged per owning project, and follows the namespace bindings that decide who
// may see them (docs/architecture.md, "Where things live").
package mcs

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/mcs"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Labels of the EndpointSlices of an import (KEP-1645's, and EndpointSlice's own managed-by so
// that Kubernetes' EndpointSlice controller leaves them alone).
const (
	LabelServiceName   = "multicluster.kubernetes.io/service-name"
	LabelSourceCluster = "multicluster.kubernetes.io/source-cluster"
	labelSliceManager  = mcs.SliceManagedByLabel
	sliceManager       = mcs.SliceManager
	// maxSliceEndpoints is the EndpointSlice API's limit.
	maxSliceEndpoints = 1000
	// Owner is the owner the desired objects name.
	Owner = "endpoint-collector"
)

// Kind tokens of desired keys: group-qualified, so that the agent maps them without a table.
var (
	importKind = mcs.ImportKind
	sliceKind  = mcs.SliceKind
)

// Export is one cluster's validated export of a service.
type Export struct {
	Cluster string
	Created time.Time
	Type    string
	Ports   []Port
}

// Port is a port of an exported Service.
type Port struct {
	Name        string `json:"name,omitempty"`
	Protocol    string `json:"protocol"`
	AppProtocol string `json:"appProtocol,omitempty"`
	Port        int32  `json:"port"`
}

// Input is what one service's computation reads.
type Input struct {
	Namespace, Name string
	// Exports of the service, by cluster.
	Exports map[string]Export
	// Bound is the project owning the namespace on each cluster where one does.
	Bound map[string]string
	// BoundSince is when each cluster's binding of the namespace was created: an export ranks
	// by the later of its reported creation time and this (a cluster's creation timestamp is
	// its agent's word, and one bound today must not win as the oldest by forging 1970).
	BoundSince map[string]time.Time
	// Endpoints returns the endpoints of project's view of the service (the collector's), nil
	// when it has none.
	Endpoints func(project string) *endpointv1.GetServiceEndpointsResponse
}

// Desired is the desired state of one service: desired key → object, and the verdicts.
type Desired struct {
	Objects map[string]*desiredv1.DesiredObject
	// Conflicts by cluster: "<reason>: <message>" for each export in conflict.
	Conflicts map[string]string
}

// Compute returns the desired objects of one service on every cluster.
func Compute(in Input) Desired {
	out := Desired{Objects: map[string]*desiredv1.DesiredObject{}, Conflicts: map[string]string{}}
	// Exports count only from clusters where a project owns the namespace, grouped by it: a
	// cluster cannot export into a project that has not bound the namespace there.
	byProject := map[string][]Export{}
	for c, e := range in.Exports {
		if p := in.Bound[c]; p != "" {
			if since := in.BoundSince[c]; since.After(e.Created) {
				e.Created = since
			}
			byProject[p] = append(byProject[p], e)
		}
	}
	for project, exps := range byProject {
		computeProject(in, project, exps, &out)
	}
	return out
}

func computeProject(in Input, project string, exps []Export, out *Desired) {
	// KEP-1645: conflicts resolve in favour of the oldest export (ties by cluster name).
	slices.SortFunc(exps, func(a, b Export) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Cluster, b.Cluster)
	})
	winner := exps[0]
	ports := slices.Clone(winner.Ports)
	included := map[string]bool{winner.Cluster: true}
	var conflicts []string
	reason := ""
	for _, e := range exps[1:] {
		if e.Type != winner.Type {
			conflicts = append(conflicts, fmt.Sprintf("cluster %s exports type %s, the oldest export (cluster %s) %s: %s's endpoints are not imported", e.Cluster, e.Type, winner.Cluster, winner.Type, e.Cluster))
			reason = cmp.Or(reason, mcs.ReasonTypeConflict)
			continue
		}
		included[e.Cluster] = true
		for _, p := range e.Ports {
			i := slices.IndexFunc(ports, func(q Port) bool { return q.Name == p.Name })
			switch {
			case i < 0:
				ports = append(ports, p) // the union of the exports' ports
			case ports[i].Port != p.Port || ports[i].Protocol != p.Protocol:
				conflicts = append(conflicts, fmt.Sprintf("port %q is %d/%s on cluster %s, %d/%s on the older export of cluster %s, which is used",
					p.Name, p.Port, p.Protocol, e.Cluster, ports[i].Port, ports[i].Protocol, winner.Cluster))
				reason = cmp.Or(reason, mcs.ReasonPortConflict)
			}
		}
	}
	if len(conflicts) > 0 {
		// KEP-1645: the condition goes on every export of the conflicted service.
		msg := reason + ": " + strings.Join(conflicts, "; ")
		if len(msg) > 32<<10 { // a condition message's limit
			msg = msg[:32<<10]
		}
		for _, e := range exps {
			out.Conflicts[e.Cluster] = msg
		}
	}
	slices.SortFunc(ports, func(a, b Port) int { return strings.Compare(a.Name, b.Name) })

	var slicesOut []sliceManifest
	if in.Endpoints != nil {
		if resp := in.Endpoints(project); resp != nil {
			for _, ce := range resp.GetClusters() {
				if !included[ce.GetClusterName()] || in.Bound[ce.GetClusterName()] != project {
					continue
				}
				slicesOut = append(slicesOut, clusterSlices(in.Namespace, in.Name, project, ce)...)
			}
		}
	}
	for cluster, p := range in.Bound {
		if p != project {
			continue
		}
		imp := importManifest(in.Namespace, in.Name, project, winner.Type, ports, out.Conflicts[cluster])
		out.Objects[subjects.DesiredKey(cluster, importKind, in.Namespace, in.Name)] = desired(imp, project)
		for _, s := range slicesOut {
			out.Objects[subjects.DesiredKey(cluster, sliceKind, in.Namespace, s.Metadata.Name)] = desired(s, project)
		}
	}
}

func desired(manifest any, project string) *desiredv1.DesiredObject {
	data, err := json.Marshal(manifest)
	if err != nil {
		panic(err) // plain structs of strings and numbers
	}
	return &desiredv1.DesiredObject{Manifest: data, OwnerLabelKey: mcs.ProjectLabel, OwnerLabelValue: project, Owner: Owner}
}

// Tombstone is the desired object saying an import or slice must go.
func Tombstone(project string) *desiredv1.DesiredObject {
	return &desiredv1.DesiredObject{Tombstone: true, DeletionPolicy: desiredv1.DeletionPolicy_DELETION_POLICY_DELETE,
		OwnerLabelKey: mcs.ProjectLabel, OwnerLabelValue: project, Owner: Owner}
}

type meta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type importManifestT struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   meta   `json:"metadata"`
	Spec       struct {
		Type  string `json:"type"`
		Ports []Port `json:"ports"`
	} `json:"spec"`
}

func importManifest(ns, name, project, typ string, ports []Port, conflict string) importManifestT {
	m := importManifestT{APIVersion: "multicluster.x-k8s.io/v1alpha1", Kind: "ServiceImport",
		Metadata: meta{Name: name, Namespace: ns, Labels: map[string]string{mcs.ProjectLabel: project}}}
	if conflict != "" {
		m.Metadata.Annotations = map[string]string{mcs.ConflictAnnotation: conflict}
	}
	m.Spec.Type, m.Spec.Ports = typ, ports
	if m.Spec.Ports == nil {
		m.Spec.Ports = []Port{}
	}
	return m
}

type sliceEndpoint struct {
	Addresses  []string `json:"addresses"`
	Conditions struct {
		Ready       bool `json:"ready"`
		Serving     bool `json:"serving"`
		Terminating bool `json:"terminating"`
	} `json:"conditions"`
	Zone     string `json:"zone,omitempty"`
	NodeName string `json:"nodeName,omitempty"`
}

type slicePort struct {
	Name     string `json:"name"`
	Protocol string `json:"protocol"`
	Port     int32  `json:"port"`
}

type sliceManifest struct {
	APIVersion  string          `json:"apiVersion"`
	Kind        string          `json:"kind"`
	Metadata    meta            `json:"metadata"`
	AddressType string          `json:"addressType"`
	Ports       []slicePort     `json:"ports"`
	Endpoints   []sliceEndpoint `json:"endpoints"`
}

// clusterSlices turns one source cluster's endpoints into EndpointSlices: one per address
// family and port set, at most maxSliceEndpoints endpoints each, named <service>.<cluster>
// (then .1, .2, … for further slices) — a dot, which no service or cluster name holds, keeps
// two (service, cluster) pairs from ever naming one slice.
func clusterSlices(ns, name, project string, ce *endpointv1.ClusterEndpoints) []sliceManifest {
	type ep struct {
		ip                          string
		v6                          bool
		ports                       []slicePort
		ready, serving, terminating bool
		zone, node                  string
	}
	byIP := map[string]*ep{}
	for _, a := range ce.GetAddresses() {
		addr, err := netip.ParseAddr(a.GetIp())
		if err != nil {
			continue
		}
		e := byIP[a.GetIp()]
		if e == nil {
			e = &ep{ip: addr.String(), v6: addr.Is6() && !addr.Is4In6(), ready: a.GetReady(), serving: a.GetServing(), terminating: a.GetTerminating(), zone: a.GetZone(), node: a.GetNode()}
			byIP[a.GetIp()] = e
		}
		p := slicePort{Name: a.GetPortName(), Protocol: cmp.Or(a.GetProtocol(), "TCP"), Port: int32(a.GetPort())}
		if !slices.Contains(e.ports, p) {
			e.ports = append(e.ports, p)
		}
	}
	groups := map[string][]*ep{}
	for _, e := range byIP {
		slices.SortFunc(e.ports, func(a, b slicePort) int { return cmp.Or(strings.Compare(a.Name, b.Name), cmp.Compare(a.Port, b.Port)) })
		groups[groupKey(e.v6, e.ports)] = append(groups[groupKey(e.v6, e.ports)], e)
	}
	gks := make([]string, 0, len(groups))
	for k := range groups {
		gks = append(gks, k)
	}
	slices.Sort(gks)
	var out []sliceManifest
	for _, gk := range gks {
		eps := groups[gk]
		slices.SortFunc(eps, func(a, b *ep) int { return strings.Compare(a.ip, b.ip) })
		for start := 0; start < len(eps); start += maxSliceEndpoints {
			chunk := eps[start:min(start+maxSliceEndpoints, len(eps))]
			sliceName := name + "." + ce.GetClusterName()
			if n := len(out); n > 0 {
				sliceName += "." + strconv.Itoa(n)
			}
			s := sliceManifest{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice", AddressType: "IPv4",
				Metadata: meta{Name: sliceName, Namespace: ns, Labels: map[string]string{
					LabelServiceName: name, LabelSourceCluster: ce.GetClusterName(), labelSliceManager: sliceManager, mcs.ProjectLabel: project}},
				Ports: chunk[0].ports, Endpoints: make([]sliceEndpoint, 0, len(chunk))}
			if chunk[0].v6 {
				s.AddressType = "IPv6"
			}
			for _, e := range chunk {
				se := sliceEndpoint{Addresses: []string{e.ip}, Zone: e.zone, NodeName: e.node}
				se.Conditions.Ready, se.Conditions.Serving, se.Conditions.Terminating = e.ready, e.serving, e.terminating
				s.Endpoints = append(s.Endpoints, se)
			}
			out = append(out, s)
		}
	}
	return out
}

func groupKey(v6 bool, ports []slicePort) string {
	h := sha256.New()
	fmt.Fprint(h, v6)
	for _, p := range ports {
		fmt.Fprintf(h, "|%s/%s/%d", p.Name, p.Protocol, p.Port)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// serviceOfKey returns the service key (namespace/name) a desired key of this package belongs
// to, and the cluster; ok is false for a key of no import or slice.
func serviceOfKey(key string) (svc, cluster string, ok bool) {
	toks, err := keys.Split(key)
	if err != nil || len(toks) != 4 {
		return "", "", false
	}
	name := toks[3]
	switch toks[1] {
	case importKind:
	case sliceKind:
		name, _, _ = strings.Cut(name, ".")
	default:
		return "", "", false
	}
	return toks[2] + "/" + name, toks[0], true
}
