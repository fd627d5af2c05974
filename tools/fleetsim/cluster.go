package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/services/cluster-agent/endpointslices"
	"github.com/fleetstream/fleetstream/services/cluster-agent/member"
)

// simKubeVersion is what every simulated apiserver answers on /version.
const simKubeVersion = "v1.34.0-fleetsim"

// simSubject is the user the grant scenario binds a project role to.
const simSubject = "fleetsim-user"

var (
	namespacesGVR   = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	roleBindingsGVR = schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}
)

// simCluster is one simulated member cluster: in-memory Kubernetes clients (client-go's fakes)
// behind the real agent (services/cluster-agent/member), connected to the hub with its own NATS
// connection and agent token. What the applier does to the fake cluster is timed here.
type simCluster struct {
	name string
	kube *kubefake.Clientset
	dyn  *dynfake.FakeDynamicClient
	nc   *nats.Conn
	done chan error
	rv   atomic.Int64

	// watchNamespace is the namespace whose RoleBindings are timed; rbApplied and rbDeleted are
	// the UnixNano of the first RoleBinding apply and delete there since the last reset (0: none).
	watchNamespace atomic.Pointer[string]
	rbApplied      atomic.Int64
	rbDeleted      atomic.Int64
	nsApplied      atomic.Int64

	// placementNS is the namespace following the placement scenario's placement; pnsApplied
	// and pnsDeleted are the UnixNano of its first apply and delete since the last reset, and
	// labelledAt that of the last UpdateCluster call changing the cluster's label.
	placementNS atomic.Pointer[string]
	pnsApplied  atomic.Int64
	pnsDeleted  atomic.Int64
	labelledAt  atomic.Int64

	// misbehaviour is how this cluster misbehaves (misbehave.go), "" for a well-behaved one;
	// refused counts the permission violations NATS reported to its connection.
	misbehaviour string
	refused      atomic.Int64
	// natsConnected is the UnixNano of its agent's first NATS connection (0: not yet),
	// disconnected and reconnected those of its last disconnection and reconnection.
	natsConnected atomic.Int64
	disconnected  atomic.Int64
	reconnected   atomic.Int64
}

// resetTimes forgets what was timed, before a new phase.
func (c *simCluster) resetTimes() {
	c.rbApplied.Store(0)
	c.rbDeleted.Store(0)
	c.nsApplied.Store(0)
}

func (c *simCluster) resetPlacementTimes() {
	c.pnsApplied.Store(0)
	c.pnsDeleted.Store(0)
}

// holdsRoleBinding reports whether the fake cluster holds any RoleBinding in ns.
func (c *simCluster) holdsRoleBinding(ns string) (bool, error) {
	l, err := c.dyn.Tracker().List(roleBindingsGVR, roleBindingsGVR.GroupVersion().WithKind("RoleBinding"), ns)
	if err != nil {
		return false, err
	}
	items, err := metaItems(l)
	return items > 0, err
}

func metaItems(l runtime.Object) (int, error) {
	switch l := l.(type) {
	case *unstructured.UnstructuredList:
		return len(l.Items), nil
	default:
		return 0, fmt.Errorf("unexpected list type %T", l)
	}
}

// unstructuredScheme knows every built-in kind as unstructured, like dynfake.NewSimpleDynamicClient
// builds per client; built once, it is shared by every simulated cluster (read-only).
var unstructuredScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for gvk := range scheme.Scheme.AllKnownTypes() {
		if len(gvk.Kind) > 4 && gvk.Kind[len(gvk.Kind)-4:] == "List" {
			s.AddKnownTypeWithName(gvk, &unstructured.UnstructuredList{})
			continue
		}
		s.AddKnownTypeWithName(gvk, &unstructured.Unstructured{})
	}
	return s
}()

// discoveryResources is what the simulated apiservers serve: the kinds the hub's desired state
// uses (namespaces with their quotas and limits, RBAC).
var discoveryResources = []*metav1.APIResourceList{
	{GroupVersion: "v1", APIResources: []metav1.APIResource{
		{Name: "namespaces", Kind: "Namespace", Namespaced: false, Verbs: allVerbs},
		{Name: "resourcequotas", Kind: "ResourceQuota", Namespaced: true, Verbs: allVerbs},
		{Name: "limitranges", Kind: "LimitRange", Namespaced: true, Verbs: allVerbs},
		{Name: "serviceaccounts", Kind: "ServiceAccount", Namespaced: true, Verbs: allVerbs},
		{Name: "configmaps", Kind: "ConfigMap", Namespaced: true, Verbs: allVerbs},
		{Name: "secrets", Kind: "Secret", Namespaced: true, Verbs: allVerbs},
		{Name: "nodes", Kind: "Node", Namespaced: false, Verbs: allVerbs},
	}},
	{GroupVersion: "rbac.authorization.k8s.io/v1", APIResources: []metav1.APIResource{
		{Name: "roles", Kind: "Role", Namespaced: true, Verbs: allVerbs},
		{Name: "rolebindings", Kind: "RoleBinding", Namespaced: true, Verbs: allVerbs},
		{Name: "clusterroles", Kind: "ClusterRole", Namespaced: false, Verbs: allVerbs},
		{Name: "clusterrolebindings", Kind: "ClusterRoleBinding", Namespaced: false, Verbs: allVerbs},
	}},
	{GroupVersion: "networking.k8s.io/v1", APIResources: []metav1.APIResource{
		{Name: "networkpolicies", Kind: "NetworkPolicy", Namespaced: true, Verbs: allVerbs},
	}},
}

var allVerbs = metav1.Verbs{"get", "list", "watch", "create", "update", "patch", "delete"}

// versionClient answers GET /version for the heartbeat: the fake discovery client has no REST
// client, and the agent asks /version through it (with a deadline). Stateless, so shared.
var versionClient = func() rest.Interface {
	body, _ := json.Marshal(map[string]string{"gitVersion": simKubeVersion, "major": "1", "minor": "34"})
	rt := roundTripper(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": []string{"application/json"}},
			Body: io.NopCloser(bytes.NewReader(body))}, nil
	})
	u, _ := url.Parse("http://fleetsim.invalid")
	c, err := rest.NewRESTClient(u, "", rest.ClientContentConfig{
		ContentType: "application/json",
		Negotiator:  runtime.NewClientNegotiator(scheme.Codecs.WithoutConversion(), schema.GroupVersion{}),
	}, nil, &http.Client{Transport: rt})
	if err != nil {
		panic(err)
	}
	return c
}()

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// simKube is the fake clientset with a discovery client that serves discoveryResources and
// /version.
type simKube struct {
	*kubefake.Clientset
	disc *simDiscovery
}

func (k *simKube) Discovery() discovery.DiscoveryInterface { return k.disc }

type simDiscovery struct{ *fakediscovery.FakeDiscovery }

func (d *simDiscovery) RESTClient() rest.Interface { return versionClient }

var _ kubernetes.Interface = (*simKube)(nil)

// newSimCluster builds the fake cluster: one Ready node and the given namespaces.
func newSimCluster(name string, namespaces int) *simCluster {
	objs := []runtime.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3500m"), corev1.ResourceMemory: resource.MustParse("15Gi")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		}},
	}
	for _, ns := range append([]string{"default", "kube-system"}, seededNamespaces(namespaces)...) {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	c := &simCluster{
		name: name,
		kube: kubefake.NewClientset(objs...),
		dyn:  dynfake.NewSimpleDynamicClientWithCustomListKinds(unstructuredScheme, nil),
		done: make(chan error, 1),
	}
	c.dyn.PrependReactor("patch", "*", c.applyReactor)
	c.dyn.PrependReactor("delete", "*", c.deleteReactor)
	c.dyn.PrependReactor("create", "*", c.createReactor)
	return c
}

func seededNamespaces(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "app-" + strconv.Itoa(i)
	}
	return out
}

func (c *simCluster) nextRV() string { return strconv.FormatInt(c.rv.Add(1), 10) }

// applyReactor implements server-side apply on the fake dynamic client, which only handles it
// for objects that exist (a strategic merge into the live one). With one field manager (the
// agent's, forced) apply is: create the object, or replace the applied fields of the live one,
// keeping labels and annotations other writers set. A stale resourceVersion conflicts, as the
// applier's conditional apply expects. Other patch types fall through to the default reactor.
func (c *simCluster) applyReactor(action k8stesting.Action) (bool, runtime.Object, error) {
	pa, ok := action.(k8stesting.PatchAction)
	if !ok || pa.GetPatchType() != types.ApplyPatchType {
		return false, nil, nil
	}
	gvr, ns, name := pa.GetResource(), pa.GetNamespace(), pa.GetName()
	applied := &unstructured.Unstructured{}
	if err := json.Unmarshal(pa.GetPatch(), &applied.Object); err != nil {
		return true, nil, apierrors.NewBadRequest(err.Error())
	}
	tracker := c.dyn.Tracker()
	liveObj, err := tracker.Get(gvr, ns, name)
	switch {
	case apierrors.IsNotFound(err):
		applied.SetResourceVersion(c.nextRV())
		applied.SetUID(types.UID(fmt.Sprintf("%s-%s-%d", c.name, gvr.Resource, c.rv.Load())))
		applied.SetCreationTimestamp(metav1.Now())
		if err := tracker.Create(gvr, applied, ns); err != nil {
			return true, nil, err
		}
		if gvr == namespacesGVR {
			// The agent's namespace inventory reads the typed client: a real cluster has one store.
			if err := c.kube.Tracker().Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsAlreadyExists(err) {
				return true, nil, err
			}
		}
		c.noteApplied(gvr, applied)
		return true, applied.DeepCopy(), nil
	case err != nil:
		return true, nil, err
	}
	live := liveObj.(*unstructured.Unstructured).DeepCopy()
	if rv := applied.GetResourceVersion(); rv != "" && rv != live.GetResourceVersion() {
		return true, nil, apierrors.NewConflict(gvr.GroupResource(), name, fmt.Errorf("resourceVersion %s is not %s", rv, live.GetResourceVersion()))
	}
	merged := applied.DeepCopy()
	merged.SetLabels(mergeMaps(live.GetLabels(), applied.GetLabels()))
	merged.SetAnnotations(mergeMaps(live.GetAnnotations(), applied.GetAnnotations()))
	merged.SetUID(live.GetUID())
	merged.SetCreationTimestamp(live.GetCreationTimestamp())
	merged.SetResourceVersion(c.nextRV())
	if err := tracker.Update(gvr, merged, ns); err != nil {
		return true, nil, err
	}
	c.noteApplied(gvr, merged)
	return true, merged, nil
}

// createReactor gives created objects a resourceVersion (informers skip updates that keep it).
func (c *simCluster) createReactor(action k8stesting.Action) (bool, runtime.Object, error) {
	ca, ok := action.(k8stesting.CreateAction)
	if !ok {
		return false, nil, nil
	}
	if u, ok := ca.GetObject().(*unstructured.Unstructured); ok && u.GetResourceVersion() == "" {
		u.SetResourceVersion(c.nextRV())
	}
	return false, nil, nil
}

func (c *simCluster) deleteReactor(action k8stesting.Action) (bool, runtime.Object, error) {
	da, ok := action.(k8stesting.DeleteAction)
	if !ok {
		return false, nil, nil
	}
	gvr := da.GetResource()
	if err := c.dyn.Tracker().Delete(gvr, da.GetNamespace(), da.GetName()); err != nil {
		return true, nil, err
	}
	if gvr == namespacesGVR {
		if err := c.kube.Tracker().Delete(gvr, "", da.GetName()); err != nil && !apierrors.IsNotFound(err) {
			return true, nil, err
		}
	}
	if gvr == namespacesGVR && c.placementWatched(da.GetName()) {
		c.pnsDeleted.CompareAndSwap(0, time.Now().UnixNano())
	}
	if gvr == roleBindingsGVR && c.watched(da.GetNamespace()) {
		c.rbDeleted.CompareAndSwap(0, time.Now().UnixNano())
	}
	return true, nil, nil
}

func (c *simCluster) placementWatched(ns string) bool {
	w := c.placementNS.Load()
	return w != nil && *w == ns
}

func (c *simCluster) watched(ns string) bool {
	w := c.watchNamespace.Load()
	return w != nil && *w == ns
}

// noteApplied times the first apply, since the last reset, of a RoleBinding for simSubject in
// the watched namespace, or of the watched namespace itself.
func (c *simCluster) noteApplied(gvr schema.GroupVersionResource, obj *unstructured.Unstructured) {
	now := time.Now().UnixNano()
	if gvr == namespacesGVR && c.placementWatched(obj.GetName()) {
		c.pnsApplied.CompareAndSwap(0, now)
	}
	switch {
	case gvr == roleBindingsGVR && c.watched(obj.GetNamespace()) && bindsSubject(obj, simSubject):
		c.rbApplied.CompareAndSwap(0, now)
	case gvr == namespacesGVR && c.watched(obj.GetName()):
		c.nsApplied.CompareAndSwap(0, now)
	}
}

func bindsSubject(rb *unstructured.Unstructured, name string) bool {
	subjects, _, _ := unstructured.NestedSlice(rb.Object, "subjects")
	for _, s := range subjects {
		if m, ok := s.(map[string]any); ok && m["name"] == name {
			return true
		}
	}
	return false
}

func mergeMaps(live, applied map[string]string) map[string]string {
	if len(live) == 0 && len(applied) == 0 {
		return nil
	}
	out := make(map[string]string, len(live)+len(applied))
	for k, v := range live {
		out[k] = v
	}
	for k, v := range applied {
		out[k] = v
	}
	return out
}

// start connects the cluster's agent to the hub with its own token and runs it until ctx ends;
// the agent's result arrives on c.done.
func (c *simCluster) start(ctx context.Context, natsURL, token string, o options, victim string, log *zap.Logger) error {
	nc, err := nats.Connect(natsURL,
		nats.Name("cluster-agent/"+c.name),
		nats.Token(token),
		// The hub lets an agent receive replies only under its own inbox prefix.
		nats.CustomInboxPrefix(natsauth.AgentInboxPrefix(c.name)),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(time.Second),
		nats.IgnoreAuthErrorAbort(), // as the cluster agent's own connection
		c.permissionErrorHandler(),
		nats.ConnectHandler(func(*nats.Conn) { c.natsConnected.CompareAndSwap(0, time.Now().UnixNano()) }),
		nats.ReconnectHandler(func(*nats.Conn) { c.reconnected.Store(time.Now().UnixNano()) }),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { c.disconnected.Store(time.Now().UnixNano()) }),
	)
	if err != nil {
		return fmt.Errorf("cluster %s: connect to nats: %w", c.name, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("cluster %s: jetstream: %w", c.name, err)
	}
	kube := &simKube{Clientset: c.kube, disc: &simDiscovery{FakeDiscovery: c.kube.Discovery().(*fakediscovery.FakeDiscovery)}}
	kube.disc.Resources = discoveryResources
	heartbeat := o.heartbeat
	if c.misbehaviour == misFlood {
		heartbeat /= 10
	}
	var agentJS jetstream.JetStream = js
	if c.misbehaviour == misNoAck {
		agentJS = silentStatusJS{js}
	}
	cfg := member.Config{
		ClusterName:       c.name,
		HeartbeatInterval: heartbeat,
		Version:           "fleetsim",
	}
	if o.has("endpoints") {
		// As the in-cluster agent with --endpointslices=all; without the scenario no informer
		// on EndpointSlices, so the other scenarios cost what they did.
		cfg.EndpointSlices = &endpointslices.Filter{Kind: "all"}
	}
	a, err := member.NewWithClients(cfg, agentJS, kube, c.dyn, log)
	if err != nil {
		nc.Close()
		return err
	}
	c.nc = nc
	go func() {
		err := a.Run(ctx)
		nc.Close()
		c.done <- err
	}()
	if c.misbehaviour != "" {
		c.misbehave(ctx, victim)
	}
	return nil
}
