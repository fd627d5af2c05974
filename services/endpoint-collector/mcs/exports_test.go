package mcs

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	eventv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/event/v1"
	"github.com/fleetstream/fleetstream/pkg/mcs"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

func envelope(t *testing.T, m proto.Message) []byte {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(&eventv1.Envelope{Payload: a})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func goodExport(name string) *endpointv1.ExportedService {
	return &endpointv1.ExportedService{Name: name, Created: timestamppb.New(t0), Type: mcs.TypeClusterSetIP,
		Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 80, Protocol: "TCP"}}}
}

// TestExportReportsAreValidated: what an agent sends is checked field by field; a report that
// fails is refused whole, with the field's path, and the namespace's earlier exports of that
// cluster go with it (never a silent partial import).
func TestExportReportsAreValidated(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*endpointv1.ServiceExportsReport)
		want   string // in the error; "" for accepted
	}{
		{"a good report", func(*endpointv1.ServiceExportsReport) {}, ""},
		{"another cluster's name in the payload", func(r *endpointv1.ServiceExportsReport) { r.ClusterName = "c2" }, "cluster_name"},
		{"another namespace in the payload", func(r *endpointv1.ServiceExportsReport) { r.Namespace = "other" }, "namespace"},
		{"a name that is no Service name", func(r *endpointv1.ServiceExportsReport) { r.Exports[0].Name = "Not_A.Name" }, "exports[0].name"},
		{"a name twice", func(r *endpointv1.ServiceExportsReport) { r.Exports = append(r.Exports, goodExport("api")) }, "exports[1].name"},
		{"an unknown type", func(r *endpointv1.ServiceExportsReport) { r.Exports[0].Type = "LoadBalancer" }, "exports[0].type"},
		{"no creation time", func(r *endpointv1.ServiceExportsReport) { r.Exports[0].Created = nil }, "exports[0].created"},
		{"port 0", func(r *endpointv1.ServiceExportsReport) { r.Exports[0].Ports[0].Port = 0 }, "exports[0].ports[0].port"},
		{"port 70000", func(r *endpointv1.ServiceExportsReport) { r.Exports[0].Ports[0].Port = 70000 }, "exports[0].ports[0].port"},
		{"a protocol Kubernetes does not have", func(r *endpointv1.ServiceExportsReport) { r.Exports[0].Ports[0].Protocol = "HTTP" }, "exports[0].ports[0].protocol"},
		{"a bad port name", func(r *endpointv1.ServiceExportsReport) { r.Exports[0].Ports[0].Name = "no spaces" }, "exports[0].ports[0].name"},
		// Kubernetes allows any DNS-1123 label as a Service port's name, longer than IANA's 15.
		{"a long Service port name", func(r *endpointv1.ServiceExportsReport) { r.Exports[0].Ports[0].Name = "grpc-health-check" }, ""},
		{"a port name no Service can have", func(r *endpointv1.ServiceExportsReport) { r.Exports[0].Ports[0].Name = strings.Repeat("a", 64) }, "exports[0].ports[0].name"},
		{"too many ports", func(r *endpointv1.ServiceExportsReport) {
			for i := range mcs.MaxPortsPerExport {
				r.Exports[0].Ports = append(r.Exports[0].Ports, &endpointv1.EndpointPort{Name: "p" + strings.Repeat("x", i%10) + string(rune('a'+i%26)), Port: 1, Protocol: "TCP"})
			}
		}, "exports[0].ports"},
		{"more exports than an agent sends", func(r *endpointv1.ServiceExportsReport) {
			for i := range mcs.MaxExportsPerReport {
				r.Exports = append(r.Exports, goodExport("s"+strings.Repeat("a", i%50)+string(rune('a'+i/50))))
			}
		}, "exports: 1001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newExportStore()
			// An earlier good report of the namespace.
			if _, err := s.handle(subjects.AgentServiceExports("c1", "web"), envelope(t, &endpointv1.ServiceExportsReport{
				ClusterName: "c1", Namespace: "web", SessionId: "s", Exports: []*endpointv1.ExportedService{goodExport("old")}})); err != nil {
				t.Fatal(err)
			}
			r := &endpointv1.ServiceExportsReport{ClusterName: "c1", Namespace: "web", SessionId: "s", Exports: []*endpointv1.ExportedService{goodExport("api")}}
			tc.mutate(r)
			changed, err := s.handle(subjects.AgentServiceExports("c1", "web"), envelope(t, r))
			if !slices.Contains(changed, "web/old") {
				t.Errorf("changed %v: the earlier export must be re-evaluated", changed)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := s.of("web", "api"); len(got) != 1 {
					t.Errorf("exports of web/api: %v", got)
				}
				return
			}
			if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want refused naming %q", err, tc.want)
			}
			if len(s.of("web", "api")) > 0 || len(s.of("web", "old")) > 0 {
				t.Errorf("a refused report left exports behind: %v %v", s.of("web", "api"), s.of("web", "old"))
			}
		})
	}
}

// TestSyncMarkerDropsOtherSessions: after an agent restarted and reported every namespace that
// has exports, the namespaces whose exports went while it was away (reported by the old
// session only) are emptied.
func TestSyncMarkerDropsOtherSessions(t *testing.T) {
	s := newExportStore()
	for ns, session := range map[string]string{"gone": "old", "kept": "new"} {
		if _, err := s.handle(subjects.AgentServiceExports("c1", ns), envelope(t, &endpointv1.ServiceExportsReport{
			ClusterName: "c1", Namespace: ns, SessionId: session, Exports: []*endpointv1.ExportedService{goodExport("api")}})); err != nil {
			t.Fatal(err)
		}
	}
	changed, err := s.handle(subjects.AgentServiceExportsSync("c1"), envelope(t, &endpointv1.ServiceExportsSync{ClusterName: "c1", SessionId: "new"}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(changed, []string{"gone/api"}) || len(s.of("gone", "api")) != 0 || len(s.of("kept", "api")) != 1 {
		t.Errorf("changed %v; gone %v, kept %v", changed, s.of("gone", "api"), s.of("kept", "api"))
	}
}

// TestLimitsOfACluster: a refused report, or exports left out past the bound, put the cluster
// out of its limits until a report of that namespace is accepted whole, or a relist of another
// session no longer reports it.
func TestLimitsOfACluster(t *testing.T) {
	s := newExportStore()
	send := func(ns, session string, r *endpointv1.ServiceExportsReport) {
		t.Helper()
		r.ClusterName, r.Namespace, r.SessionId = "c1", ns, session
		_, _ = s.handle(subjects.AgentServiceExports("c1", ns), envelope(t, r))
	}
	want := func(reason string) {
		t.Helper()
		if got, msg := s.limits("c1"); got != reason {
			t.Fatalf("limits %q (%s), want %q", got, msg, reason)
		}
	}
	want("")
	send("web", "s1", &endpointv1.ServiceExportsReport{Exports: []*endpointv1.ExportedService{goodExport("api")}, Omitted: 9000})
	want(ReasonServiceExportsOmitted)
	send("web", "s1", &endpointv1.ServiceExportsReport{Exports: []*endpointv1.ExportedService{goodExport("api")}})
	want("")
	send("ops", "s1", &endpointv1.ServiceExportsReport{Exports: []*endpointv1.ExportedService{goodExport("Bad_Name")}})
	want(ReasonInvalidServiceExports)
	// A restarted agent's relist that does not report ops again: ops has no exports now.
	if _, err := s.handle(subjects.AgentServiceExportsSync("c1"), envelope(t, &endpointv1.ServiceExportsSync{ClusterName: "c1", SessionId: "s2"})); err != nil {
		t.Fatal(err)
	}
	want("")
}

// TestExportFloodOfUnboundNamespaces: a compromised agent reporting exports in 20,000
// namespaces no project has bound on its cluster makes the hub hold no report of them and at
// most maxNamespaces names, counted as refused past that; its bound namespace's report is
// still taken, and a relist clears the count.
func TestExportFloodOfUnboundNamespaces(t *testing.T) {
	s := newExportStore()
	s.maxNamespaces = 100
	s.bound = func(cluster, ns string) bool { return cluster == "c1" && ns == "web" }
	send := func(ns string) error {
		_, err := s.handle(subjects.AgentServiceExports("c1", ns), envelope(t, &endpointv1.ServiceExportsReport{
			ClusterName: "c1", Namespace: ns, SessionId: "s1", Exports: []*endpointv1.ExportedService{goodExport("api")}}))
		return err
	}
	refused := 0
	for i := range 20000 {
		if err := send(fmt.Sprintf("ns-%d", i)); err != nil {
			refused++
		}
	}
	if err := send("web"); err != nil {
		t.Fatalf("the bound namespace's report: %v", err)
	}
	s.mu.Lock()
	held, reports, names := s.heldLocked("c1"), len(s.clusters["c1"]), len(s.unbound["c1"])
	s.mu.Unlock()
	if reports != 1 || held > 101 || names > 100 {
		t.Errorf("held %d namespaces (%d reports, %d unbound names), want web's report and at most 100 names", held, reports, names)
	}
	if refused != 20000-100 {
		t.Errorf("%d reports refused, want %d", refused, 20000-100)
	}
	if got := s.of("web", "api"); len(got) != 1 {
		t.Errorf("exports of web/api: %v", got)
	}
	if reason, msg := s.limits("c1"); reason != ReasonInvalidServiceExports || !strings.Contains(msg, "19900") {
		t.Errorf("limits %s %q", reason, msg)
	}
	// A relist of the agent that reports web only.
	if err := send("web"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.handle(subjects.AgentServiceExportsSync("c1"), envelope(t, &endpointv1.ServiceExportsSync{ClusterName: "c1", SessionId: "s1"})); err != nil {
		t.Fatal(err)
	}
	if reason, msg := s.limits("c1"); reason != "" {
		t.Errorf("after the relist: limits %s %q", reason, msg)
	}
}
