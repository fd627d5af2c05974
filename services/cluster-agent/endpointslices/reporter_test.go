package endpointslices

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

func TestParseFilter(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Filter
		wantErr bool
	}{
		{in: "", want: Filter{Kind: "all"}},
		{in: "all", want: Filter{Kind: "all"}},
		{in: "label=expose", want: Filter{Kind: "label", Key: "expose"}},
		{in: "label=fleetstream.io/expose=true", want: Filter{Kind: "label", Key: "fleetstream.io/expose", Value: "true", HasValue: true}},
		{in: "annotation=fleetstream.io/expose", want: Filter{Kind: "annotation", Key: "fleetstream.io/expose"}},
		{in: "annotation=a=", want: Filter{Kind: "annotation", Key: "a", HasValue: true}},
		{in: "label=", wantErr: true},
		{in: "label==x", wantErr: true},
		{in: "selector=a", wantErr: true},
	} {
		got, err := ParseFilter(tc.in)
		if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
			t.Errorf("ParseFilter(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// recorder is an Appender keeping the latest report per subject, like FLEET_AGENT does, and
// failing on demand.
type recorder struct {
	mu     sync.Mutex
	latest map[string]proto.Message
	ttls   map[string]time.Duration // of the latest report per subject
	fail   bool
	syncs  int
	// refused holds the subjects of the appends refused while failing.
	refused map[string]bool
	// noTTL refuses expiring appends as a FLEET_AGENT without per-message TTLs does.
	noTTL bool
}

func (r *recorder) Append(_ context.Context, subject, _ string, expect events.Expect, m proto.Message) (uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		if r.refused == nil {
			r.refused = map[string]bool{}
		}
		r.refused[subject] = true
		return 0, errors.New("hub unreachable")
	}
	if r.noTTL && expect.TTL() > 0 {
		return 0, fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: 10166, Description: "per-message TTL is disabled"})
	}
	r.latest[subject] = proto.Clone(m)
	if r.ttls == nil {
		r.ttls = map[string]time.Duration{}
	}
	r.ttls[subject] = expect.TTL()
	if _, ok := m.(*endpointv1.EndpointSliceSync); ok {
		r.syncs++
	}
	return 1, nil
}

func (r *recorder) setFail(f bool) {
	r.mu.Lock()
	r.fail = f
	r.mu.Unlock()
}

// state renders the slices the collector would hold: not tombstoned, and not pruned by the
// latest relist marker. "ns/slice=svc:ip,ip".
func (r *recorder) state() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var marker *endpointv1.EndpointSliceSync
	for _, m := range r.latest {
		if s, ok := m.(*endpointv1.EndpointSliceSync); ok {
			marker = s
		}
	}
	var out []string
	for _, m := range r.latest {
		s, ok := m.(*endpointv1.EndpointSliceReport)
		if !ok || s.Deleted || (marker != nil && (s.SessionId != marker.SessionId || s.Generation < marker.Generation)) {
			continue
		}
		var ips []string
		for _, e := range s.Endpoints {
			c := ""
			if !e.Ready {
				c += "!r"
			}
			if e.Terminating {
				c += "+t"
			}
			ips = append(ips, e.Addresses[0]+c)
		}
		out = append(out, fmt.Sprintf("%s/%s=%s:%s", s.Namespace, s.Slice, s.Service, strings.Join(ips, ",")))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// ttlsOK checks that tombstones, and only they, expire after want.
func (r *recorder) ttlsOK(want time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	tombstones := 0
	for subject, m := range r.latest {
		s, ok := m.(*endpointv1.EndpointSliceReport)
		switch {
		case ok && s.Deleted:
			tombstones++
			if r.ttls[subject] != want {
				return fmt.Errorf("tombstone on %s expires after %s, want %s", subject, r.ttls[subject], want)
			}
		case r.ttls[subject] != 0:
			return fmt.Errorf("report on %s expires after %s, want never", subject, r.ttls[subject])
		}
	}
	if tombstones == 0 {
		return errors.New("no tombstone reported")
	}
	return nil
}

// wasRefused reports whether an append to subject was refused.
func (r *recorder) wasRefused(subject string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused[subject]
}

func (r *recorder) syncCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.syncs
}

func ptr[T any](v T) *T { return &v }

func slice(ns, name, svc string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

func endpoint(ip string, ready, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready || terminating), Terminating: ptr(terminating)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: "pod-" + ip, UID: types.UID("uid-" + ip)},
		NodeName:   ptr("node-1"), Zone: ptr("zone-a")}
}

func apply(t *testing.T, kube kubernetes.Interface, s *discoveryv1.EndpointSlice) {
	t.Helper()
	ctx := context.Background()
	cur, err := kube.DiscoveryV1().EndpointSlices(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
	if err == nil {
		s.ResourceVersion = cur.ResourceVersion
		_, err = kube.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
	} else {
		_, err = kube.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("apply endpointslice %s: %v", s.Name, err)
	}
}

func TestReporterAgainstKubeAPIServer(t *testing.T) {
	kube := testkit.StartKube(t)
	ctx := testkit.Context(t, 90*time.Second)
	for _, ns := range []string{"shop", "ops"} {
		if _, err := kube.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc := func(ns, name string, lbls map[string]string) {
		_, err := kube.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	svc("shop", "cart", map[string]string{"expose": "yes"})
	svc("ops", "metrics", nil)
	apply(t, kube.Client, slice("shop", "cart-1", "cart", endpoint("10.0.0.1", true, false), endpoint("10.0.0.2", false, false)))
	apply(t, kube.Client, slice("ops", "metrics-1", "metrics", endpoint("10.0.9.1", true, false)))

	for _, tc := range []struct {
		filter string
		want   string
	}{
		{"all", "default/kubernetes=kubernetes:192.0.2.2 ops/metrics-1=metrics:10.0.9.1 shop/cart-1=cart:10.0.0.1,10.0.0.2!r"},
		{"label=expose=yes", "shop/cart-1=cart:10.0.0.1,10.0.0.2!r"},
	} {
		t.Run(tc.filter, func(t *testing.T) {
			f, err := ParseFilter(tc.filter)
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{latest: map[string]proto.Message{}}
			factory := informers.NewSharedInformerFactory(kube.Client, 0)
			r, err := New(Config{ClusterName: "east", Filter: f, Resync: time.Hour}, factory, rec, testkit.Logger(t))
			if err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			factory.Start(rctx.Done())
			go func() { done <- r.Run(rctx) }()
			defer func() {
				cancel()
				<-done
				factory.Shutdown()
			}()
			wait := func(want string) {
				t.Helper()
				testkit.Eventually(t, 15*time.Second, func() error {
					if got := rec.state(); got != want {
						return fmt.Errorf("\n got %s\nwant %s", got, want)
					}
					return nil
				})
			}
			wait(tc.want)
			testkit.Eventually(t, 5*time.Second, func() error {
				if n := rec.syncCount(); n != 1 {
					return fmt.Errorf("want one relist marker, got %d", n)
				}
				return nil
			})
			if tc.filter == "all" {
				return
			}
			// The service gains the label: its slices are reported; loses it: tombstoned.
			m, _ := kube.Client.CoreV1().Services("ops").Get(ctx, "metrics", metav1.GetOptions{})
			m.Labels = map[string]string{"expose": "yes"}
			if _, err := kube.Client.CoreV1().Services("ops").Update(ctx, m, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			wait("ops/metrics-1=metrics:10.0.9.1 shop/cart-1=cart:10.0.0.1,10.0.0.2!r")
			m, _ = kube.Client.CoreV1().Services("ops").Get(ctx, "metrics", metav1.GetOptions{})
			m.Labels = nil
			if _, err := kube.Client.CoreV1().Services("ops").Update(ctx, m, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			wait("shop/cart-1=cart:10.0.0.1,10.0.0.2!r")

			// Update and delete are reported; a terminating endpoint keeps its conditions.
			apply(t, kube.Client, slice("shop", "cart-1", "cart", endpoint("10.0.0.1", false, true), endpoint("10.0.0.3", true, false)))
			wait("shop/cart-1=cart:10.0.0.1!r+t,10.0.0.3")

			// The hub is unreachable while a slice is deleted and another created: once it is
			// back, the missed reports are sent and a relist marker follows.
			rec.setFail(true)
			if err := kube.Client.DiscoveryV1().EndpointSlices("shop").Delete(ctx, "cart-1", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			apply(t, kube.Client, slice("shop", "cart-2", "cart", endpoint("10.0.0.4", true, false)))
			// Both reports were tried and refused, so what follows is the recovery.
			testkit.Eventually(t, 15*time.Second, func() error {
				for _, name := range []string{"cart-1", "cart-2"} {
					if subj := subjects.AgentEndpointSlice("east", "shop", name); !rec.wasRefused(subj) {
						return fmt.Errorf("no report of %s tried during the outage", name)
					}
				}
				return nil
			})
			syncs := rec.syncCount()
			rec.setFail(false)
			wait("shop/cart-2=cart:10.0.0.4")
			testkit.Eventually(t, 15*time.Second, func() error {
				if rec.syncCount() <= syncs {
					return errors.New("no relist marker after the outage")
				}
				return nil
			})

			// A deleted slice's tombstone expires (FLEET_AGENT would otherwise keep one per slice
			// ever deleted); snapshots never do.
			if err := kube.Client.DiscoveryV1().EndpointSlices("shop").Delete(ctx, "cart-2", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			testkit.Eventually(t, 15*time.Second, func() error { return rec.ttlsOK(DefaultTombstoneTTL) })

			// A hub whose FLEET_AGENT predates per-message TTLs refuses an expiring append: the
			// deletion is reported without a TTL instead of being retried for ever.
			rec.mu.Lock()
			rec.noTTL = true
			rec.mu.Unlock()
			apply(t, kube.Client, slice("shop", "cart-3", "cart", endpoint("10.0.0.5", true, false)))
			wait("shop/cart-3=cart:10.0.0.5")
			if err := kube.Client.DiscoveryV1().EndpointSlices("shop").Delete(ctx, "cart-3", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			cart3 := subjects.AgentEndpointSlice("east", "shop", "cart-3")
			testkit.Eventually(t, 15*time.Second, func() error {
				rec.mu.Lock()
				defer rec.mu.Unlock()
				if m, ok := rec.latest[cart3].(*endpointv1.EndpointSliceReport); !ok || !m.Deleted || rec.ttls[cart3] != 0 {
					return fmt.Errorf("cart-3: latest report %v with TTL %s, want its deletion without a TTL", rec.latest[cart3], rec.ttls[cart3])
				}
				return nil
			})
		})
	}
}
