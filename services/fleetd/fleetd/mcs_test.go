package fleetd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	mcscrd "sigs.k8s.io/mcs-api/config/crd"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-agent/endpointslices"
	"github.com/fleetstream/fleetstream/services/cluster-agent/mcs"
	"github.com/fleetstream/fleetstream/services/cluster-agent/member"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// mcsMember is a member cluster with the MCS CRDs and its agent, as cmd/cluster-agent
// assembles it.
type mcsMember struct {
	name string
	kube *testkit.Kube
	dyn  dynamic.Interface
}

// TestMultiClusterServices: issue 33's item 2 end to end, fleetd and two member apiservers
// with their agents. A ServiceExport on c1 becomes a ServiceImport on c2 with c1's endpoints in
// an EndpointSlice labelled as KEP-1645 says; a port conflict shows as Conflict on both
// exports; deleting the exports removes the import and its slices; a namespace unbound from
// c2 loses its import there.
func TestMultiClusterServices(t *testing.T) {
	inst, clusters := startFleetd(t)
	ctx := testkit.Context(t, 4*time.Minute)
	projects := projectv1connect.NewProjectServiceClient(http.DefaultClient, "http://"+inst.Addr, withToken(apiToken))

	members := map[string]*mcsMember{}
	for _, name := range []string{"c1", "c2"} {
		reg, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: name}))
		if err != nil {
			t.Fatal(err)
		}
		kube := testkit.StartKube(t)
		kube.InstallCRD(t, mcscrd.ServiceExportCRD)
		kube.InstallCRD(t, mcscrd.ServiceImportCRD)
		dyn, err := dynamic.NewForConfig(kube.Config)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := connectAgent(inst, name, reg.Msg.AgentToken, make(chan error, 1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		a, err := member.New(member.Config{ClusterName: name, HeartbeatInterval: 300 * time.Millisecond,
			EndpointSlices: &endpointslices.Filter{Kind: "all"}}, js, kube.Config, testkit.Logger(t).Named(name))
		if err != nil {
			t.Fatal(err)
		}
		actx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- a.Run(actx) }()
		t.Cleanup(func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("%s's agent: %v", name, err)
			}
		})
		members[name] = &mcsMember{name: name, kube: kube, dyn: dyn}
	}
	m1, m2 := members["c1"], members["c2"]

	if _, err := projects.CreateProject(ctx, connect.NewRequest(&projectv1.CreateProjectRequest{Name: "team-a"})); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"c1", "c2"} {
		if _, err := projects.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{Project: "team-a", Cluster: c, Namespace: "web"})); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range members {
		testkit.Eventually(t, time.Minute, func() error {
			ns, err := m.kube.Client.CoreV1().Namespaces().Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if ns.Labels["fleetstream.io/project"] != "team-a" {
				return fmt.Errorf("%s: namespace web labelled %v", m.name, ns.Labels)
			}
			return nil
		})
	}

	// c1 runs web/api on two pods and exports it.
	m1.service(t, ctx, "api", 80, "10.1.0.1", "10.1.0.2")
	m1.export(t, ctx, "api")

	// c2 gets the import with c1's endpoints.
	testkit.Eventually(t, time.Minute, func() error {
		imp, err := m2.serviceImport(ctx, "api")
		if err != nil {
			return err
		}
		if imp.Spec.Type != mcsv1alpha1.ClusterSetIP || len(imp.Spec.Ports) != 1 || imp.Spec.Ports[0].Port != 80 || imp.Spec.Ports[0].Name != "http" {
			return fmt.Errorf("import spec %+v", imp.Spec)
		}
		return m2.wantSlices(ctx, "api", map[string][]string{"c1": {"10.1.0.1", "10.1.0.2"}})
	})
	// A rogue agent of c3, a registered cluster where web is bound to no project, reports an
	// export of web/api, older than c1's, on another port and type, with endpoints of its own:
	// none of it reaches the project's clusters.
	reg3, err := clusters.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c3"}))
	if err != nil {
		t.Fatal(err)
	}
	nc3, err := connectAgent(inst, "c3", reg3.Msg.AgentToken, make(chan error, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc3.Close()
	js3, err := jetstream.New(nc3)
	if err != nil {
		t.Fatal(err)
	}
	// It heartbeats, so the collector serves its endpoints (kept apart: no project owns web there).
	hbCtx, stopHB := context.WithCancel(ctx)
	defer stopHB()
	go func() {
		for hbCtx.Err() == nil {
			data, _ := proto.Marshal(&agentv1.Heartbeat{ClusterName: "c3", AgentVersion: "rogue", KubernetesVersion: "v1.34.0", SessionId: "rogue", Time: timestamppb.Now()})
			_ = nc3.Publish(subjects.AgentLiveHeartbeat("c3"), data)
			select {
			case <-hbCtx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	rogue := events.NewStore(js3, "system:cluster-agent:c3")
	eps := endpointv1connect.NewEndpointServiceClient(http.DefaultClient, "http://"+inst.Addr, withToken(apiToken))
	if _, err := rogue.Append(ctx, subjects.AgentEndpointSlice("c3", "web", "api-rogue"), "c3", events.Any, &endpointv1.EndpointSliceReport{
		ClusterName: "c3", Namespace: "web", Service: "api", Slice: "api-rogue", AddressType: "IPv4", SessionId: "rogue", Generation: 1,
		Ports:     []*endpointv1.EndpointPort{{Name: "http", Port: 8080, Protocol: "TCP"}},
		Endpoints: []*endpointv1.Endpoint{{Addresses: []string{"10.66.0.1"}, Ready: true, Serving: true}},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := rogue.Append(ctx, subjects.AgentServiceExports("c3", "web"), "c3", events.Any, &endpointv1.ServiceExportsReport{
		ClusterName: "c3", Namespace: "web", SessionId: "rogue", Exports: []*endpointv1.ExportedService{{Name: "api", Type: "Headless",
			Created: timestamppb.New(time.Unix(0, 0)), Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 6666, Protocol: "TCP"}}}},
	}); err != nil {
		t.Fatal(err)
	}
	// Once the hub holds both forgeries, a full reconcile must leave c2's import as it was.
	testkit.Eventually(t, 30*time.Second, func() error {
		// c3's report was read, and dropped: web is bound to no project there.
		if ub := inst.MCS.Unbound("c3"); !slices.Contains(ub, "web") {
			return fmt.Errorf("c3's namespaces dropped as unbound: %v", ub)
		}
		if ex := inst.MCS.Exporters("web", "api"); slices.Contains(ex, "c3") {
			return fmt.Errorf("exporters of web/api: %v, the hub holds c3's unbound report", ex)
		}
		// A platform admin reads the service's whole state, the clusters kept apart included.
		all, err := eps.GetServiceEndpoints(ctx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{Namespace: "web", Name: "api",
			Filter: endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL}))
		if err != nil {
			return err
		}
		for _, c := range all.Msg.GetClusters() {
			if c.GetClusterName() == "c3" {
				return nil
			}
		}
		return fmt.Errorf("c3's endpoints not held yet")
	})
	if err := inst.MCS.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// What the hub now wants on c2, read from desired-mcs: c2's live objects could not have
	// changed yet, whatever the hub decided.
	imp, bySource := desiredForCluster(t, ctx, inst.JS, "c2", "api")
	if imp == nil || imp.Spec.Type != mcsv1alpha1.ClusterSetIP || len(imp.Spec.Ports) != 1 || imp.Spec.Ports[0].Port != 80 || imp.Annotations["mcs.fleetstream.io/conflict"] != "" {
		t.Errorf("c3's forged export changed c2's desired import: %+v", imp)
	}
	if want := map[string][]string{"c1": {"10.1.0.1", "10.1.0.2"}}; fmt.Sprint(bySource) != fmt.Sprint(want) {
		t.Errorf("c2's desired imported endpoints by source %v, want %v (c3's forged endpoints?)", bySource, want)
	}

	// An invalid report (a name no Service can have) is refused, and c3 shows it as
	// AgentWithinLimits=False; a valid one of the same namespace clears it.
	badReport := func(name string) *endpointv1.ServiceExportsReport {
		return &endpointv1.ServiceExportsReport{ClusterName: "c3", Namespace: "other", SessionId: "rogue", Exports: []*endpointv1.ExportedService{{Name: name,
			Type: "ClusterSetIP", Created: timestamppb.Now(), Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 80, Protocol: "TCP"}}}}}
	}
	withinLimits := func(status clusterv1.ConditionStatus, reason string) func() error {
		return func() error {
			res, err := clusters.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c3"}))
			if err != nil {
				return err
			}
			c := clusterimport.Condition(res.Msg.Cluster, subjects.ConditionAgentWithinLimits)
			switch {
			case status == clusterv1.ConditionStatus_CONDITION_STATUS_TRUE && (c == nil || c.Status == status):
				return nil
			case c == nil || c.Status != status || c.Reason != reason:
				return fmt.Errorf("c3's AgentWithinLimits: %v, want %v %s", c, status, reason)
			}
			return nil
		}
	}
	if _, err := rogue.Append(ctx, subjects.AgentServiceExports("c3", "other"), "c3", events.Any, badReport("Not_A_Service")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, withinLimits(clusterv1.ConditionStatus_CONDITION_STATUS_FALSE, "InvalidServiceExports"))
	if _, err := rogue.Append(ctx, subjects.AgentServiceExports("c3", "other"), "c3", events.Any, badReport("fine")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, withinLimits(clusterv1.ConditionStatus_CONDITION_STATUS_TRUE, ""))

	// c1 has the import too (it is bound to the project), and no conflict is reported.
	testkit.Eventually(t, time.Minute, func() error {
		if _, err := m1.serviceImport(ctx, "api"); err != nil {
			return err
		}
		return m1.wantConflict(ctx, "api", metav1.ConditionFalse, "NoConflicts")
	})

	// c2 exports web/api too, younger and on another port: the older export's port stays,
	// both exports report the conflict, and c2's endpoints join the import.
	m2.service(t, ctx, "api", 81, "10.2.0.1")
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has a second's resolution
	m2.export(t, ctx, "api")
	testkit.Eventually(t, time.Minute, func() error {
		for _, m := range []*mcsMember{m1, m2} {
			if err := m.wantConflict(ctx, "api", metav1.ConditionTrue, "PortConflict"); err != nil {
				return err
			}
		}
		imp, err := m2.serviceImport(ctx, "api")
		if err != nil {
			return err
		}
		if len(imp.Spec.Ports) != 1 || imp.Spec.Ports[0].Port != 80 {
			return fmt.Errorf("import ports %+v: want the oldest export's 80", imp.Spec.Ports)
		}
		return m2.wantSlices(ctx, "api", map[string][]string{"c1": {"10.1.0.1", "10.1.0.2"}, "c2": {"10.2.0.1"}})
	})

	// Drift: an imported slice deleted by hand comes back.
	if err := m2.kube.Client.DiscoveryV1().EndpointSlices("web").Delete(ctx, "api.c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Minute, func() error {
		return m2.wantSlices(ctx, "api", map[string][]string{"c1": {"10.1.0.1", "10.1.0.2"}, "c2": {"10.2.0.1"}})
	})

	// c2's export goes: the conflict is over, c2's endpoints leave the import.
	m2.unexport(t, ctx, "api")
	testkit.Eventually(t, time.Minute, func() error {
		if err := m1.wantConflict(ctx, "api", metav1.ConditionFalse, "NoConflicts"); err != nil {
			return err
		}
		return m2.wantSlices(ctx, "api", map[string][]string{"c1": {"10.1.0.1", "10.1.0.2"}})
	})

	// c1's export goes: nothing exports web/api, the import and its slices go everywhere.
	m1.unexport(t, ctx, "api")
	for _, m := range members {
		testkit.Eventually(t, time.Minute, func() error { return m.wantNoImport(ctx, "api") })
	}

	// Exported again, then web unbound from c2: c2 loses the import, c1 keeps it.
	m1.export(t, ctx, "api")
	testkit.Eventually(t, time.Minute, func() error {
		if _, err := m2.serviceImport(ctx, "api"); err != nil {
			return err
		}
		return m2.wantSlices(ctx, "api", map[string][]string{"c1": {"10.1.0.1", "10.1.0.2"}})
	})
	if _, err := projects.UnbindNamespace(ctx, connect.NewRequest(&projectv1.UnbindNamespaceRequest{Project: "team-a", Cluster: "c2", Namespace: "web"})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Minute, func() error { return m2.wantNoImport(ctx, "api") })
	if _, err := m1.serviceImport(ctx, "api"); err != nil {
		t.Errorf("c1 lost its import with c2's unbinding: %v", err)
	}

	// A project member churns exports under new names: each leaves tombstones in desired-mcs
	// (an import and a slice per cluster), which the hub collects once the agents confirm the
	// objects gone. Without that the bucket grew by every name ever exported.
	for i := range 5 {
		name := fmt.Sprintf("churn-%d", i)
		m1.service(t, ctx, name, 80, fmt.Sprintf("10.1.1.%d", i+1))
		m1.export(t, ctx, name)
		testkit.Eventually(t, time.Minute, func() error { _, err := m1.serviceImport(ctx, name); return err })
		m1.unexport(t, ctx, name)
		testkit.Eventually(t, time.Minute, func() error { return m1.wantNoImport(ctx, name) })
	}
	m1.unexport(t, ctx, "api")
	testkit.Eventually(t, time.Minute, func() error { return m1.wantNoImport(ctx, "api") })
	stream, err := inst.JS.Stream(ctx, "KV_"+subjects.DesiredMCSBucket)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, time.Minute, func() error {
		// Confirmations arrive after the removals; a reconcile of every service collects.
		if err := inst.MCS.Sync(ctx); err != nil {
			return err
		}
		info, err := stream.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 0 {
			return fmt.Errorf("desired-mcs holds %d messages on %d keys after every export went", info.State.Msgs, info.State.NumSubjects)
		}
		return nil
	})
}

// service creates Service web/<name> (port "http", target 8080) and its EndpointSlice with ips.
func (m *mcsMember) service(t *testing.T, ctx context.Context, name string, port int32, ips ...string) {
	t.Helper()
	if _, err := m.kube.Client.CoreV1().Services("web").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: port, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, ip := range ips {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if _, err := m.kube.Client.DiscoveryV1().EndpointSlices("web").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

func (m *mcsMember) export(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": mcsv1alpha1.SchemeGroupVersion.String(), "kind": "ServiceExport",
		"metadata": map[string]any{"name": name, "namespace": "web"}}}
	if _, err := m.dyn.Resource(mcs.ExportsGVR).Namespace("web").Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (m *mcsMember) unexport(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if err := m.dyn.Resource(mcs.ExportsGVR).Namespace("web").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (m *mcsMember) serviceImport(ctx context.Context, name string) (*mcsv1alpha1.ServiceImport, error) {
	u, err := m.dyn.Resource(mcs.ImportsGVR).Namespace("web").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.name, err)
	}
	var imp mcsv1alpha1.ServiceImport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &imp); err != nil {
		return nil, err
	}
	return &imp, nil
}

// wantSlices checks the imported EndpointSlices of service name: by source cluster, the
// addresses of its endpoints.
func (m *mcsMember) wantSlices(ctx context.Context, name string, want map[string][]string) error {
	list, err := m.kube.Client.DiscoveryV1().EndpointSlices("web").List(ctx, metav1.ListOptions{LabelSelector: mcsv1alpha1.LabelServiceName + "=" + name})
	if err != nil {
		return err
	}
	got := map[string][]string{}
	for _, s := range list.Items {
		if _, local := s.Labels[discoveryv1.LabelServiceName]; local {
			return fmt.Errorf("%s: imported slice %s claims a local Service", m.name, s.Name)
		}
		src := s.Labels[mcsv1alpha1.LabelSourceCluster]
		for _, e := range s.Endpoints {
			got[src] = append(got[src], e.Addresses...)
		}
	}
	for c := range got {
		slices.Sort(got[c])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("%s: imported endpoints of %s by source %v, want %v", m.name, name, got, want)
	}
	return nil
}

func (m *mcsMember) wantConflict(ctx context.Context, name string, status metav1.ConditionStatus, reason string) error {
	u, err := m.dyn.Resource(mcs.ExportsGVR).Namespace("web").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("%s: %w", m.name, err)
	}
	var se mcsv1alpha1.ServiceExport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &se); err != nil {
		return err
	}
	for _, c := range se.Status.Conditions {
		if c.Type == string(mcsv1alpha1.ServiceExportConditionConflict) {
			if c.Status != status || c.Reason != reason || c.ObservedGeneration != se.Generation {
				return fmt.Errorf("%s: Conflict %s (%s: %s) at generation %d, want %s (%s)", m.name, c.Status, c.Reason, c.Message, c.ObservedGeneration, status, reason)
			}
			return nil
		}
	}
	return fmt.Errorf("%s: no Conflict condition: %+v", m.name, se.Status.Conditions)
}

func (m *mcsMember) wantNoImport(ctx context.Context, name string) error {
	if _, err := m.dyn.Resource(mcs.ImportsGVR).Namespace("web").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: import %s still there (%v)", m.name, name, err)
	}
	list, err := m.kube.Client.DiscoveryV1().EndpointSlices("web").List(ctx, metav1.ListOptions{LabelSelector: mcsv1alpha1.LabelServiceName + "=" + name})
	if err != nil {
		return err
	}
	if len(list.Items) > 0 {
		var names []string
		for _, s := range list.Items {
			names = append(names, s.Name)
		}
		return fmt.Errorf("%s: imported slices %s still there", m.name, strings.Join(names, ", "))
	}
	return nil
}

// desiredForCluster reads what desired-mcs holds for cluster of web/name: the ServiceImport
// (nil if none) and the imported endpoints by source cluster, tombstones left out.
func desiredForCluster(t *testing.T, ctx context.Context, js jetstream.JetStream, cluster, name string) (*mcsv1alpha1.ServiceImport, map[string][]string) {
	t.Helper()
	kv, err := js.KeyValue(ctx, subjects.DesiredMCSBucket)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := kv.ListKeysFiltered(ctx, keys.Encode(cluster)+".>")
	if err != nil {
		t.Fatal(err)
	}
	var imp *mcsv1alpha1.ServiceImport
	bySource := map[string][]string{}
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		d := &desiredv1.DesiredObject{}
		if err := proto.Unmarshal(e.Value(), d); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if d.GetTombstone() {
			continue
		}
		var head metav1.TypeMeta
		if err := json.Unmarshal(d.GetManifest(), &head); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		switch head.Kind {
		case "ServiceImport":
			var si mcsv1alpha1.ServiceImport
			if err := json.Unmarshal(d.GetManifest(), &si); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			if si.Namespace == "web" && si.Name == name {
				imp = &si
			}
		case "EndpointSlice":
			var es discoveryv1.EndpointSlice
			if err := json.Unmarshal(d.GetManifest(), &es); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			if es.Namespace != "web" || es.Labels[mcsv1alpha1.LabelServiceName] != name {
				continue
			}
			src := es.Labels[mcsv1alpha1.LabelSourceCluster]
			for _, ep := range es.Endpoints {
				bySource[src] = append(bySource[src], ep.Addresses...)
			}
		}
	}
	for c := range bySource {
		slices.Sort(bySource[c])
	}
	return imp, bySource
}
