package fleetd_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/mcs"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// TestMultiClusterServicesSurviveHubRestart: a hub restarted on the same JetStream, whose
// export reports are all still there, must not tombstone the imports of a service that is
// still exported. The writer used to take its lease and reconcile every service it had
// written while the report reader had not yet read them: each such service counted no
// exports, and its import was tombstoned on every member until the reader caught up. Here the
// service's report comes after many others, so the reader reaches it last.
func TestMultiClusterServicesSurviveHubRestart(t *testing.T) {
	dir := t.TempDir()
	withDir := func(c *fleetd.Config) { c.DataDir = dir }
	inst, clusters := startFleetd(t, withDir)
	ctx := testkit.Context(t, 4*time.Minute)
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, "http://"+inst.Addr, withToken(apiToken))

	tokens := map[string]string{}
	for _, name := range []string{"c1", "c2"} {
		reg, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = reg.Msg.AgentToken
	}
	if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "team-a"})); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"c1", "c2"} {
		if _, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Cluster: c, Namespace: "web"})); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := connectAgent(inst, "c1", tokens["c1"], make(chan error, 1))
	if err != nil {
		t.Fatal(err)
	}
	js1, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	agent := events.NewStore(js1, "system:cluster-agent:c1")
	report := func(ns, svc string) {
		t.Helper()
		if _, err := agent.Append(ctx, subjects.AgentServiceExports("c1", ns), "c1", events.Any, &endpointv1.ServiceExportsReport{
			ClusterName: "c1", Namespace: ns, SessionId: "s1", Exports: []*endpointv1.ExportedService{{Name: svc, Type: "ClusterSetIP",
				Created: timestamppb.Now(), Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 80, Protocol: "TCP"}}}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Reports of many other namespaces first, then web's: the restarted reader reads web's last.
	for i := range 2000 {
		report(fmt.Sprintf("other-%d", i), "svc")
	}
	report("web", "api")
	nc.Close()

	importKey := subjects.DesiredKey("c2", mcs.ImportKind, "web", "api")
	kv, err := inst.JS.KeyValue(ctx, subjects.DesiredMCSBucket)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Minute, func() error {
		e, err := kv.Get(ctx, importKey)
		if err != nil {
			return err
		}
		d := &desiredv1.DesiredObject{}
		if err := proto.Unmarshal(e.Value(), d); err != nil || d.GetTombstone() {
			return fmt.Errorf("%s: tombstone or bad (%v)", importKey, err)
		}
		return nil
	})
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
	inst.Stop()

	inst, _ = startFleetd(t, withDir)
	testkit.Eventually(t, time.Minute, func() error {
		if ex := inst.MCS.Exporters("web", "api"); !slices.Contains(ex, "c1") {
			return fmt.Errorf("exporters of web/api after the restart: %v", ex)
		}
		return nil
	})
	if err := inst.MCS.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// Everything the restarted hub wrote into desired-mcs, read from the bucket's history.
	kv, err = inst.JS.KeyValue(ctx, subjects.DesiredMCSBucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IncludeHistory())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	for e := range w.Updates() {
		if e == nil {
			break
		}
		if e.Revision() <= before {
			continue
		}
		d := &desiredv1.DesiredObject{}
		if e.Operation() != jetstream.KeyValuePut || proto.Unmarshal(e.Value(), d) != nil || d.GetTombstone() {
			t.Errorf("the restarted hub removed %s (revision %d, %v)", e.Key(), e.Revision(), e.Operation())
		}
	}
}

// TestMultiClusterServicesExportBeforeBinding: the hub holds no report of a namespace not
// bound on its cluster, yet an export reported before the binding (the agent does not report
// it again: for it nothing changed) counts once the namespace is bound there: the hub re-reads
// the report from the stream.
func TestMultiClusterServicesExportBeforeBinding(t *testing.T) {
	inst, clusters := startFleetd(t)
	ctx := testkit.Context(t, 2*time.Minute)
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, "http://"+inst.Addr, withToken(apiToken))
	tokens := map[string]string{}
	for _, name := range []string{"c1", "c2"} {
		reg, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = reg.Msg.AgentToken
	}
	if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "team-a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Cluster: "c2", Namespace: "web"})); err != nil {
		t.Fatal(err)
	}
	nc, err := connectAgent(inst, "c1", tokens["c1"], make(chan error, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js1, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.NewStore(js1, "system:cluster-agent:c1").Append(ctx, subjects.AgentServiceExports("c1", "web"), "c1", events.Any, &endpointv1.ServiceExportsReport{
		ClusterName: "c1", Namespace: "web", SessionId: "s1", Exports: []*endpointv1.ExportedService{{Name: "api", Type: "ClusterSetIP",
			Created: timestamppb.Now(), Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 80, Protocol: "TCP"}}}},
	}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		if ub := inst.MCS.Unbound("c1"); !slices.Contains(ub, "web") {
			return fmt.Errorf("c1's namespaces dropped as unbound: %v", ub)
		}
		return nil
	})
	if _, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Cluster: "c1", Namespace: "web"})); err != nil {
		t.Fatal(err)
	}
	kv, err := inst.JS.KeyValue(ctx, subjects.DesiredMCSBucket)
	if err != nil {
		t.Fatal(err)
	}
	importKey := subjects.DesiredKey("c2", mcs.ImportKind, "web", "api")
	testkit.Eventually(t, time.Minute, func() error {
		e, err := kv.Get(ctx, importKey)
		if err != nil {
			return fmt.Errorf("%s: %w", importKey, err)
		}
		d := &desiredv1.DesiredObject{}
		if err := proto.Unmarshal(e.Value(), d); err != nil || d.GetTombstone() {
			return fmt.Errorf("%s: tombstone or bad (%v)", importKey, err)
		}
		return nil
	})
}
