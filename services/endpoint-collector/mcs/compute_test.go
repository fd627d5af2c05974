package mcs

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/mcs"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

var t0 = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

func httpPort(n int32) []Port { return []Port{{Name: "http", Protocol: "TCP", Port: n}} }

func endpointsOf(clusters map[string][]string) func(string) *endpointv1.GetServiceEndpointsResponse {
	return func(string) *endpointv1.GetServiceEndpointsResponse {
		r := &endpointv1.GetServiceEndpointsResponse{}
		for _, c := range slices.Sorted(maps.Keys(clusters)) {
			ce := &endpointv1.ClusterEndpoints{ClusterName: c}
			for _, ip := range clusters[c] {
				ce.Addresses = append(ce.Addresses, &endpointv1.Address{Ip: ip, Port: 8080, PortName: "http", Protocol: "TCP", Ready: true, Serving: true})
			}
			r.Clusters = append(r.Clusters, ce)
		}
		return r
	}
}

func TestCompute(t *testing.T) {
	type want struct {
		// objects by desired key: "import" or the slice's endpoints
		imports   map[string]string // cluster → spec.type
		ports     []int32           // the import's ports
		slices    map[string][]string
		conflicts map[string]string // cluster → reason
	}
	for _, tc := range []struct {
		name string
		in   Input
		want want
	}{
		{
			name: "an export on c1 is imported on every cluster of the project, with c1's endpoints",
			in: Input{Namespace: "web", Name: "api",
				Exports:   map[string]Export{"c1": {Cluster: "c1", Created: t0, Type: mcs.TypeClusterSetIP, Ports: httpPort(80)}},
				Bound:     map[string]string{"c1": "team-a", "c2": "team-a", "c3": "team-b"},
				Endpoints: endpointsOf(map[string][]string{"c1": {"10.0.0.1", "10.0.0.2"}})},
			want: want{imports: map[string]string{"c1": "ClusterSetIP", "c2": "ClusterSetIP"}, ports: []int32{80},
				slices: map[string][]string{"api.c1": {"10.0.0.1", "10.0.0.2"}}},
		},
		{
			name: "an export from a cluster where no project owns the namespace counts for nothing",
			in: Input{Namespace: "web", Name: "api",
				Exports:   map[string]Export{"c9": {Cluster: "c9", Created: t0, Type: mcs.TypeClusterSetIP, Ports: httpPort(80)}},
				Bound:     map[string]string{"c1": "team-a"},
				Endpoints: endpointsOf(map[string][]string{"c9": {"10.9.9.9"}})},
			want: want{},
		},
		{
			name: "endpoints of a cluster without an export are not imported",
			in: Input{Namespace: "web", Name: "api",
				Exports:   map[string]Export{"c1": {Cluster: "c1", Created: t0, Type: mcs.TypeHeadless, Ports: httpPort(80)}},
				Bound:     map[string]string{"c1": "team-a", "c2": "team-a"},
				Endpoints: endpointsOf(map[string][]string{"c1": {"10.0.0.1"}, "c2": {"10.0.1.1"}})},
			want: want{imports: map[string]string{"c1": "Headless", "c2": "Headless"}, ports: []int32{80},
				slices: map[string][]string{"api.c1": {"10.0.0.1"}}},
		},
		{
			name: "a port conflict: the oldest export's port is used, both exports are in conflict, both clusters' endpoints imported",
			in: Input{Namespace: "web", Name: "api",
				Exports: map[string]Export{
					"c1": {Cluster: "c1", Created: t0.Add(time.Minute), Type: mcs.TypeClusterSetIP, Ports: httpPort(81)},
					"c2": {Cluster: "c2", Created: t0, Type: mcs.TypeClusterSetIP, Ports: httpPort(80)},
				},
				Bound:     map[string]string{"c1": "team-a", "c2": "team-a"},
				Endpoints: endpointsOf(map[string][]string{"c1": {"10.0.0.1"}, "c2": {"10.0.1.1"}})},
			want: want{imports: map[string]string{"c1": "ClusterSetIP", "c2": "ClusterSetIP"}, ports: []int32{80},
				slices:    map[string][]string{"api.c1": {"10.0.0.1"}, "api.c2": {"10.0.1.1"}},
				conflicts: map[string]string{"c1": mcs.ReasonPortConflict, "c2": mcs.ReasonPortConflict}},
		},
		{
			name: "a type conflict: the oldest type wins and the other's endpoints stay out",
			in: Input{Namespace: "web", Name: "api",
				Exports: map[string]Export{
					"c1": {Cluster: "c1", Created: t0, Type: mcs.TypeHeadless, Ports: httpPort(80)},
					"c2": {Cluster: "c2", Created: t0, Type: mcs.TypeClusterSetIP, Ports: httpPort(80)},
				},
				Bound:     map[string]string{"c1": "team-a", "c2": "team-a"},
				Endpoints: endpointsOf(map[string][]string{"c1": {"10.0.0.1"}, "c2": {"10.0.1.1"}})},
			want: want{imports: map[string]string{"c1": "Headless", "c2": "Headless"}, ports: []int32{80},
				slices:    map[string][]string{"api.c1": {"10.0.0.1"}},
				conflicts: map[string]string{"c1": mcs.ReasonTypeConflict, "c2": mcs.ReasonTypeConflict}},
		},
		{
			name: "an export forging an old creation time ranks from its cluster's binding: the earlier bound cluster's export wins",
			in: Input{Namespace: "web", Name: "api",
				Exports: map[string]Export{
					"c1": {Cluster: "c1", Created: t0.Add(time.Hour), Type: mcs.TypeClusterSetIP, Ports: httpPort(80)},
					"c2": {Cluster: "c2", Created: time.Unix(0, 0), Type: mcs.TypeHeadless, Ports: httpPort(6666)},
				},
				Bound:      map[string]string{"c1": "team-a", "c2": "team-a"},
				BoundSince: map[string]time.Time{"c1": t0, "c2": t0.Add(2 * time.Hour)},
				Endpoints:  endpointsOf(map[string][]string{"c1": {"10.0.0.1"}, "c2": {"10.0.1.1"}})},
			want: want{imports: map[string]string{"c1": "ClusterSetIP", "c2": "ClusterSetIP"}, ports: []int32{80},
				slices:    map[string][]string{"api.c1": {"10.0.0.1"}},
				conflicts: map[string]string{"c1": mcs.ReasonTypeConflict, "c2": mcs.ReasonTypeConflict}},
		},
		{
			name: "different ports of other names are merged",
			in: Input{Namespace: "web", Name: "api",
				Exports: map[string]Export{
					"c1": {Cluster: "c1", Created: t0, Type: mcs.TypeClusterSetIP, Ports: httpPort(80)},
					"c2": {Cluster: "c2", Created: t0.Add(time.Second), Type: mcs.TypeClusterSetIP, Ports: []Port{{Name: "grpc", Protocol: "TCP", Port: 9090}}},
				},
				Bound: map[string]string{"c1": "team-a", "c2": "team-a"}},
			want: want{imports: map[string]string{"c1": "ClusterSetIP", "c2": "ClusterSetIP"}, ports: []int32{9090, 80}},
		},
		{
			name: "two projects owning the namespace on different clusters each get their own import",
			in: Input{Namespace: "web", Name: "api",
				Exports: map[string]Export{
					"c1": {Cluster: "c1", Created: t0, Type: mcs.TypeClusterSetIP, Ports: httpPort(80)},
					"c3": {Cluster: "c3", Created: t0, Type: mcs.TypeHeadless, Ports: httpPort(81)},
				},
				Bound: map[string]string{"c1": "team-a", "c2": "team-a", "c3": "team-b"}},
			want: want{imports: map[string]string{"c1": "ClusterSetIP", "c2": "ClusterSetIP", "c3": "Headless"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Compute(tc.in)
			gotImports := map[string]string{}
			gotSlices := map[string][]string{}
			var gotPorts []int32
			for k, obj := range d.Objects {
				svc, cluster, ok := serviceOfKey(k)
				if !ok || svc != "web/api" {
					t.Fatalf("key %s: service %q", k, svc)
				}
				if obj.GetOwnerLabelKey() != mcs.ProjectLabel || obj.GetOwnerLabelValue() != tc.in.Bound[cluster] {
					t.Errorf("%s: owner %s=%s, want the project of %s", k, obj.GetOwnerLabelKey(), obj.GetOwnerLabelValue(), cluster)
				}
				var m map[string]any
				if err := json.Unmarshal(obj.GetManifest(), &m); err != nil {
					t.Fatal(err)
				}
				switch m["kind"] {
				case "ServiceImport":
					spec := m["spec"].(map[string]any)
					gotImports[cluster] = spec["type"].(string)
					if tc.want.ports != nil && cluster == "c1" {
						for _, p := range spec["ports"].([]any) {
							gotPorts = append(gotPorts, int32(p.(map[string]any)["port"].(float64)))
						}
					}
					ann, _ := m["metadata"].(map[string]any)["annotations"].(map[string]any)
					c, _ := ann[mcs.ConflictAnnotation].(string)
					if reason := tc.want.conflicts[cluster]; !strings.HasPrefix(c, reason) || (reason == "") != (c == "") {
						t.Errorf("%s: conflict annotation %q, want reason %q", k, c, reason)
					}
				case "EndpointSlice":
					md := m["metadata"].(map[string]any)
					labels := md["labels"].(map[string]any)
					if labels[LabelServiceName] != "api" || labels[LabelSourceCluster] == nil {
						t.Errorf("%s: labels %v", k, labels)
					}
					if _, ok := labels["kubernetes.io/service-name"]; ok {
						t.Errorf("%s: an imported slice must not claim a local Service", k)
					}
					var ips []string
					for _, e := range m["endpoints"].([]any) {
						ips = append(ips, e.(map[string]any)["addresses"].([]any)[0].(string))
					}
					name := md["name"].(string)
					if prev, ok := gotSlices[name]; ok && !slices.Equal(prev, ips) {
						t.Errorf("slice %s differs between clusters: %v, %v", name, prev, ips)
					}
					gotSlices[name] = ips
				}
			}
			if !maps.Equal(gotImports, nonNil(tc.want.imports)) {
				t.Errorf("imports %v, want %v", gotImports, tc.want.imports)
			}
			if tc.want.ports != nil && !slices.Equal(gotPorts, tc.want.ports) {
				t.Errorf("ports %v, want %v", gotPorts, tc.want.ports)
			}
			if !maps.EqualFunc(gotSlices, nonNilS(tc.want.slices), slices.Equal) {
				t.Errorf("slices %v, want %v", gotSlices, tc.want.slices)
			}
			for c := range d.Conflicts {
				if tc.want.conflicts[c] == "" {
					t.Errorf("cluster %s in conflict: %s", c, d.Conflicts[c])
				}
			}
		})
	}
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func nonNilS(m map[string][]string) map[string][]string {
	if m == nil {
		return map[string][]string{}
	}
	return m
}

// TestManyEndpointsSplitIntoSlices: one source's endpoints past the EndpointSlice API's 1,000
// go into further slices, named apart.
func TestManyEndpointsSplitIntoSlices(t *testing.T) {
	ips := make([]string, 2500)
	for i := range ips {
		ips[i] = "10.1." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1)
	}
	d := Compute(Input{Namespace: "web", Name: "api",
		Exports:   map[string]Export{"c1": {Cluster: "c1", Created: t0, Type: mcs.TypeHeadless, Ports: httpPort(80)}},
		Bound:     map[string]string{"c1": "p"},
		Endpoints: endpointsOf(map[string][]string{"c1": ips})})
	var names []string
	total := 0
	for k, obj := range d.Objects {
		if !strings.Contains(k, "EndpointSlice") {
			continue
		}
		var m sliceManifest
		if err := json.Unmarshal(obj.GetManifest(), &m); err != nil {
			t.Fatal(err)
		}
		if len(m.Endpoints) > maxSliceEndpoints {
			t.Errorf("%s: %d endpoints", m.Metadata.Name, len(m.Endpoints))
		}
		total += len(m.Endpoints)
		names = append(names, m.Metadata.Name)
	}
	slices.Sort(names)
	if want := []string{"api.c1", "api.c1.1", "api.c1.2"}; !slices.Equal(names, want) || total != 2500 {
		t.Errorf("slices %v with %d endpoints, want %v with 2500", names, total, want)
	}
	if k := subjects.DesiredKey("c1", sliceKind, "web", "api.c1.2"); d.Objects[k] == nil {
		t.Errorf("no key %s", k)
	}
}
