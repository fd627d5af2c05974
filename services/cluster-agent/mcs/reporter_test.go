package mcs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	mcscrd "sigs.k8s.io/mcs-api/config/crd"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/mcs"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// recorder keeps the latest report per subject, as FLEET_AGENT does.
type recorder struct {
	mu     sync.Mutex
	latest map[string]proto.Message
	sizes  map[string]int
}

func (r *recorder) Append(_ context.Context, subject, _ string, _ events.Expect, payload proto.Message) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.latest[subject] = proto.Clone(payload)
	r.sizes[subject] = proto.Size(payload)
	return 1, nil
}

func (r *recorder) report(cluster, ns string) (*endpointv1.ServiceExportsReport, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := subjects.AgentServiceExports(cluster, ns)
	m, _ := r.latest[s].(*endpointv1.ServiceExportsReport)
	return m, r.sizes[s]
}

// TestExportFloodIsBounded: 10,000 ServiceExports (with their Services) in one namespace of a
// real apiserver make one report of the 1,000 oldest, the other 9,000 counted as omitted and
// within the byte bound; the reporter goes on reporting other namespaces; exports in a
// namespace the agent did not bind are not reported at all.
func TestExportFloodIsBounded(t *testing.T) {
	kube := testkit.StartKube(t)
	kube.InstallCRD(t, mcscrd.ServiceExportCRD)
	kube.InstallCRD(t, mcscrd.ServiceImportCRD)
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t, 5*time.Minute)
	bound := map[string]string{managedByLabel: managedByValue, mcs.ProjectLabel: "p"}
	for ns, labels := range map[string]map[string]string{"flood": bound, "calm": bound, "loose": nil} {
		if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exportOf := func(ns, name string) error {
		if _, err := kube.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		_, err := dyn.Resource(ExportsGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": mcsv1alpha1.SchemeGroupVersion.String(), "kind": "ServiceExport", "metadata": map[string]any{"name": name}}}, metav1.CreateOptions{})
		return err
	}
	if err := exportOf("loose", "s"); err != nil {
		t.Fatal(err)
	}

	rec := &recorder{latest: map[string]proto.Message{}, sizes: map[string]int{}}
	r, err := New(Config{ClusterName: "c1", SessionID: "s1"}, kube.Client, dyn, rec, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	const n = 10000
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			return exportOf("flood", fmt.Sprintf("s-%05d", i))
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d Services and ServiceExports in %v", n, time.Since(start))
	created := time.Now()

	testkit.Eventually(t, 2*time.Minute, func() error {
		rep, size := rec.report("c1", "flood")
		if rep == nil || int(rep.Omitted)+len(rep.Exports) != n {
			return fmt.Errorf("flood report: %d exports, %d omitted", len(rep.GetExports()), rep.GetOmitted())
		}
		if len(rep.Exports) != mcs.MaxExportsPerReport || size > mcs.MaxReportBytes {
			return fmt.Errorf("flood report: %d exports in %d bytes, want %d within %d", len(rep.Exports), size, mcs.MaxExportsPerReport, mcs.MaxReportBytes)
		}
		for i := 1; i < len(rep.Exports); i++ {
			if rep.Exports[i].Created.AsTime().Before(rep.Exports[i-1].Created.AsTime()) {
				return fmt.Errorf("exports not oldest first at %d", i)
			}
		}
		return nil
	})
	t.Logf("flood reported (1,000 of 10,000, bounded) %v after the last create", time.Since(created))

	// The flood stalls nothing: an export elsewhere is reported at once.
	calmAt := time.Now()
	if err := exportOf("calm", "api"); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, func() error {
		rep, _ := rec.report("c1", "calm")
		if len(rep.GetExports()) != 1 || rep.Exports[0].Name != "api" || rep.Exports[0].Type != mcs.TypeHeadless {
			return fmt.Errorf("calm report %v", rep)
		}
		return nil
	})
	t.Logf("an export in another namespace (Service and ServiceExport created) reported %v after the first create call", time.Since(calmAt))
	// Exports get their Valid condition: True for a Service that exists, False (NoService)
	// for one that does not, which the report leaves out.
	if _, err := dyn.Resource(ExportsGVR).Namespace("calm").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mcsv1alpha1.SchemeGroupVersion.String(), "kind": "ServiceExport", "metadata": map[string]any{"name": "nosvc"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"api": "True/Valid", "nosvc": "False/NoService"} {
		testkit.Eventually(t, 30*time.Second, func() error {
			u, err := dyn.Resource(ExportsGVR).Namespace("calm").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if m := c.(map[string]any); m["type"] == "Valid" && fmt.Sprint(m["status"], "/", m["reason"]) == want {
					return nil
				}
			}
			return fmt.Errorf("%s's conditions %v, want Valid %s", name, conds, want)
		})
	}
	if rep, _ := rec.report("c1", "calm"); len(rep.GetExports()) != 1 {
		t.Errorf("calm report %v: an export without a Service was reported", rep)
	}
	if rep, _ := rec.report("c1", "loose"); rep != nil {
		t.Errorf("an export in a namespace the agent did not bind was reported: %v", rep)
	}
}

// TestReportedExportsPassTheHubsChecks: the agent judges each export by the hub's own checks
// (mcs.ValidateExport) before reporting it, so what it reports is never refused. A Service
// whose port name is longer than IANA's 15 characters (valid for a Service) is reported and
// Valid; one past the ports an export may have is Valid=False and left out.
func TestReportedExportsPassTheHubsChecks(t *testing.T) {
	kube := testkit.StartKube(t)
	kube.InstallCRD(t, mcscrd.ServiceExportCRD)
	kube.InstallCRD(t, mcscrd.ServiceImportCRD)
	dyn, err := dynamic.NewForConfig(kube.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testkit.Context(t, 2*time.Minute)
	if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web",
		Labels: map[string]string{managedByLabel: managedByValue, mcs.ProjectLabel: "p"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	many := make([]corev1.ServicePort, mcs.MaxPortsPerExport+1)
	for i := range many {
		many[i] = corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: int32(1000 + i)}
	}
	for name, ports := range map[string][]corev1.ServicePort{
		"health": {{Name: "grpc-health-check", Port: 8081}, {Name: "http", Port: 80}},
		"many":   many,
	} {
		if _, err := kube.Client.CoreV1().Services("web").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.ServiceSpec{Ports: ports}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(ExportsGVR).Namespace("web").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": mcsv1alpha1.SchemeGroupVersion.String(), "kind": "ServiceExport", "metadata": map[string]any{"name": name}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rec := &recorder{latest: map[string]proto.Message{}, sizes: map[string]int{}}
	r, err := New(Config{ClusterName: "c1", SessionID: "s1"}, kube.Client, dyn, rec, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for name, want := range map[string]string{"health": "True/Valid", "many": "False/InvalidServiceType"} {
		testkit.Eventually(t, 30*time.Second, func() error {
			u, err := dyn.Resource(ExportsGVR).Namespace("web").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if m := c.(map[string]any); m["type"] == "Valid" && fmt.Sprint(m["status"], "/", m["reason"]) == want {
					return nil
				}
			}
			return fmt.Errorf("%s's conditions %v, want Valid %s", name, conds, want)
		})
	}
	rep, _ := rec.report("c1", "web")
	if len(rep.GetExports()) != 1 || rep.Exports[0].GetName() != "health" {
		t.Fatalf("report %v, want health's export only", rep)
	}
	for i, e := range rep.GetExports() {
		if err := mcs.ValidateExport(e); err != nil {
			t.Errorf("exports[%d] fails the hub's checks: %v", i, err)
		}
	}
}
