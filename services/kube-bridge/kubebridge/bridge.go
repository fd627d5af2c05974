// Package kubebridge publishes the fleet onto a hub Kubernetes API server as the objects the
// multi-cluster tools read (issue 33, docs/kubernetes.md): a ClusterProfile
// (multicluster.x-k8s.io/v1alpha1, SIG-Multicluster's cluster inventory) per registered cluster
// and OCM's PlacementDecisions (cluster.open-cluster-management.io/v1beta1) per page of every
// placement decision, in the hub namespace mapped to the placement's project.
//
// It reads the fleet from the registry's and the scheduler's views (buckets `clusters` and
// `placement-decisions`) with the kube-bridge NATS identity, which may read those and write
// nothing but its own lease (pkg/natsauth): what the bridge is told cannot reach Fleetstream back. It writes the
// hub with client-go, by server-side apply under field manager fleetstream-kube-bridge, in the
// shape of the agent's applier: view changes and hub informer events queue keys on a
// rate-limited workqueue (pkg/reconcile), and one reconcile per key brings the hub in line.
package kubebridge

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	ocmv1beta1 "open-cluster-management.io/api/cluster/v1beta1"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/lease"
	"github.com/fleetstream/fleetstream/pkg/reconcile"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/view"
	inventoryv1alpha1 "github.com/fleetstream/fleetstream/services/kube-bridge/inventory/v1alpha1"
)

// PlacementDecisionGVR addresses OCM's PlacementDecisions.
var PlacementDecisionGVR = ocmv1beta1.GroupVersion.WithResource("placementdecisions")

// conditionReason is what metav1.Condition's schema accepts as a reason.
var conditionReason = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// LeasePrefix begins the name of the lease (pkg/lease, bucket fleet-leases) a bridge holds while
// it writes: kube-bridge.<uid of the hub's kube-system namespace>. So two bridges on one hub (two
// replicas, or fleetd's and a binary's) write one at a time, and bridges of different hubs do
// not wait on each other. The kube-bridge NATS identity may write these keys alone.
const LeasePrefix = "kube-bridge"

// Bridge is the kube bridge: one writer per hub API server at a time, under a lease; another
// bridge of the same hub mirrors the same state and stands by.
type Bridge struct {
	cfg  Config
	js   jetstream.JetStream
	log  *zap.Logger
	dyn  dynamic.Interface
	kube kubernetes.Interface
	now  func() time.Time

	ready     chan struct{}
	readyOnce sync.Once
	// leading is whether this bridge holds the hub's lease (and so writes); leaseName is it.
	leading   atomic.Bool
	leaseName string
	leader    prometheus.Gauge

	// Set by Run before the controllers start.
	clusters  *view.Cache[*clusterv1.Cluster]
	decisions *view.Cache[*placementv1.PlacementDecisions]

	profileInformer   cache.SharedIndexInformer
	decisionInformer  cache.SharedIndexInformer
	namespaceInformer cache.SharedIndexInformer
	startInformers    func(stop <-chan struct{})
	stopInformers     func()

	profiles   *reconcile.Controller
	placements *reconcile.Controller

	// The write side: fleetstream.io custom resources into Fleetstream; nil without an API
	// token (Config.APITokenFile).
	in      *inbound
	inbound *reconcile.Controller

	// applies counts server-side applies made (tests: an idle resync makes none).
	applies atomic.Int64
	// leftOut and foreign count, per kind, the objects applied without some field the hub's
	// schema would refuse, and the objects of a name another writer holds.
	leftOut *prometheus.CounterVec
	foreign *prometheus.CounterVec
}

// Applies is how many server-side applies the bridge has made.
func (b *Bridge) Applies() int64 { return b.applies.Load() }

// NewFromKubeconfig is New with the hub named by cfg.Kubeconfig, or the cluster the bridge runs
// in with cfg.InCluster.
func NewFromKubeconfig(cfg Config, js jetstream.JetStream, log *zap.Logger) (*Bridge, error) {
	if cfg.InCluster {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kube bridge: --kube-bridge-in-cluster: %w", err)
		}
		return New(cfg, js, rc, log)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kube bridge: --kube-bridge-kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	return New(cfg, js, rc, log)
}

// New returns a bridge publishing to the hub at rc what it reads through js.
func New(cfg Config, js jetstream.JetStream, rc *rest.Config, log *zap.Logger) (*Bridge, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kube bridge: %w", err)
	}
	cfg.withDefaults()
	rc = rest.CopyConfig(rc)
	rc.UserAgent = FieldManager
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube bridge: %w", err)
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube bridge: %w", err)
	}
	log = log.Named("kube-bridge")
	b := &Bridge{cfg: cfg, js: js, log: log, dyn: dyn, kube: kube, now: time.Now, ready: make(chan struct{}),
		leftOut: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetstream_kube_bridge_left_out_total",
			Help: "Objects the kube bridge applied without some of the fleet's fields, which the hub's schema would refuse (logged by field path)."}, []string{"kind"}),
		foreign: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetstream_kube_bridge_foreign_objects_total",
			Help: "Times the kube bridge left alone an object of a name it would write because another writer holds it."}, []string{"kind"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fleetstream_kube_bridge_leader",
			Help: "1 while this kube bridge holds its hub's lease and writes, 0 while another bridge of the hub does (standby)."}),
	}

	// The hub's side: the ClusterProfiles of the namespace (every manager's: a name another
	// manager holds is not taken over), the PlacementDecisions the bridge wrote (anywhere), and
	// the namespaces mapped to a project.
	profiles := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, cfg.Namespace, nil)
	b.profileInformer = profiles.ForResource(inventoryv1alpha1.GroupVersionResource).Informer()
	decisions := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = LabelManagedBy + "=" + FieldManager
	})
	b.decisionInformer = decisions.ForResource(PlacementDecisionGVR).Informer()
	if err := b.decisionInformer.AddIndexers(cache.Indexers{byPlacement: placementIndex}); err != nil {
		return nil, fmt.Errorf("kube bridge: %w", err)
	}
	namespaces := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = LabelProject
	}))
	b.namespaceInformer = namespaces.Core().V1().Namespaces().Informer()
	if err := b.namespaceInformer.AddIndexers(cache.Indexers{byProject: projectIndex}); err != nil {
		return nil, fmt.Errorf("kube bridge: %w", err)
	}
	var customs dynamicinformer.DynamicSharedInformerFactory
	if cfg.APITokenFile != "" {
		token, err := daemon.ReadSecretFile(cfg.APITokenFile)
		if err != nil {
			return nil, fmt.Errorf("kube bridge: --kube-bridge-api-token-file: %w", err)
		}
		var admin string
		if cfg.ProjectsTokenFile != "" {
			if admin, err = daemon.ReadSecretFile(cfg.ProjectsTokenFile); err != nil {
				return nil, fmt.Errorf("kube bridge: --kube-bridge-projects-token-file: %w", err)
			}
		}
		b.in = newInbound(cfg.APIURL, token, admin)
		customs = dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
		for _, k := range inboundKinds {
			// The dynamic informer indexes by namespace already (cache.NamespaceIndex).
			ik := &inboundKind{name: k.name, gvr: k.gvr, namespaced: k.namespaced, inf: customs.ForResource(k.gvr).Informer()}
			b.in.kinds = append(b.in.kinds, ik)
		}
		b.inbound = reconcile.New(reconcile.Config{Name: "kube-bridge-inbound", Keys: b.inboundKeys, Resync: cfg.Resync,
			Workers: cfg.Workers, MaxDelay: time.Minute, Timeout: time.Minute, Log: log}, reconcile.Func(b.reconcileInbound))
		for _, k := range b.in.kinds {
			name := k.name
			if _, err := k.inf.AddEventHandler(handler(func(obj any) { b.inbound.Add(inboundKey(name, obj)) })); err != nil {
				return nil, fmt.Errorf("kube bridge: %w", err)
			}
		}
	}
	b.startInformers = func(stop <-chan struct{}) {
		profiles.Start(stop)
		decisions.Start(stop)
		namespaces.Start(stop)
		if customs != nil {
			customs.Start(stop)
		}
	}
	// After stop: Run returns only once the informers' goroutines have (a stopped fleetd leaves
	// none behind).
	b.stopInformers = func() {
		profiles.Shutdown()
		decisions.Shutdown()
		namespaces.Shutdown()
		if customs != nil {
			customs.Shutdown()
		}
	}

	b.profiles = reconcile.New(reconcile.Config{Name: "kube-bridge-clusterprofiles", Keys: b.profileKeys, Resync: cfg.Resync,
		Workers: cfg.Workers, MaxDelay: time.Minute, Timeout: time.Minute, Log: log}, reconcile.Func(b.reconcileProfile))
	b.placements = reconcile.New(reconcile.Config{Name: "kube-bridge-placementdecisions", Keys: b.placementKeys, Resync: cfg.Resync,
		Workers: cfg.Workers, MaxDelay: time.Minute, Timeout: time.Minute, Log: log}, reconcile.Func(b.reconcilePlacement))

	// Hub events queue what they touch: a profile or decision edited or deleted by hand is put
	// back (drift), a namespace (un)mapped moves its project's decisions.
	if _, err := b.profileInformer.AddEventHandler(handler(func(obj any) { b.profiles.Add(objectName(obj)) })); err != nil {
		return nil, fmt.Errorf("kube bridge: %w", err)
	}
	if _, err := b.decisionInformer.AddEventHandler(handler(func(obj any) {
		if k := placementKeyOf(obj); k != "" {
			b.placements.Add(k)
		}
	})); err != nil {
		return nil, fmt.Errorf("kube bridge: %w", err)
	}
	if _, err := b.namespaceInformer.AddEventHandler(handler(func(obj any) {
		if p := labelOf(obj, LabelProject); p != "" {
			b.queueProject(p)
		}
		b.queueNamespace(objectName(obj))
	})); err != nil {
		return nil, fmt.Errorf("kube bridge: %w", err)
	}
	return b, nil
}

// Mount registers the bridge's metrics and readiness (its binary's /readyz).
func (b *Bridge) Mount(srv *server.Server) {
	srv.ReadyWhen("kube-bridge", b.ready)
	for _, c := range b.Collectors() {
		_ = srv.Registry().Register(c)
	}
}

// Collectors are the bridge's metrics: its queues' and its refusals.
func (b *Bridge) Collectors() []prometheus.Collector {
	out := append(append(b.profiles.Collectors(), b.placements.Collectors()...), b.leftOut, b.foreign, b.leader)
	if b.inbound != nil {
		out = append(out, b.inbound.Collectors()...)
	}
	return out
}

// Ready is closed once the bridge has installed its CRDs and mirrors the views and the hub: it
// then reconciles, or stands by while another bridge of the hub holds the lease.
func (b *Bridge) Ready() <-chan struct{} { return b.ready }

// Leading reports whether this bridge holds its hub's lease, and so is the one that writes.
func (b *Bridge) Leading() bool { return b.leading.Load() }

// Sync reconciles every key of both kinds against the views and the hub as they are now (tests).
func (b *Bridge) Sync(ctx context.Context) error {
	var in error
	if b.inbound != nil {
		in = b.inbound.Sync(ctx)
	}
	return errors.Join(b.profiles.Sync(ctx), b.placements.Sync(ctx), in)
}

// Run publishes until ctx ends. A hub that cannot be reached is retried (with backoff, the
// failure logged), never a reason to stop: the bridge converges when it comes back.
func (b *Bridge) Run(ctx context.Context) error {
	err := b.run(ctx)
	return server.Stopped(ctx, err)
}

func (b *Bridge) run(ctx context.Context) error {
	if err := b.retry(ctx, "install CRDs", b.installCRDs); err != nil {
		return err
	}
	if err := b.retry(ctx, "ensure namespace "+b.cfg.Namespace, b.ensureNamespace); err != nil {
		return err
	}
	if err := b.retry(ctx, "identify the hub (namespace kube-system)", b.identifyHub); err != nil {
		return err
	}
	clustersKV, err := view.WaitBucket(ctx, b.js, subjects.ClustersBucket, b.log)
	if err != nil {
		return fmt.Errorf("kube bridge: %w", err)
	}
	decisionsKV, err := view.WaitBucket(ctx, b.js, subjects.PlacementDecisionsBucket, b.log)
	if err != nil {
		return fmt.Errorf("kube bridge: %w", err)
	}
	b.clusters = view.NewCache(b.js, clustersKV, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, b.log)
	b.decisions = view.NewCache(b.js, decisionsKV, func() *placementv1.PlacementDecisions { return &placementv1.PlacementDecisions{} }, b.log)

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return b.clusters.Run(ctx) })
	g.Go(func() error { return b.decisions.Run(ctx) })
	b.startInformers(ctx.Done())
	defer b.stopInformers()
	g.Go(func() error {
		for _, ready := range []<-chan struct{}{b.clusters.Ready(), b.decisions.Ready()} {
			select {
			case <-ready:
			case <-ctx.Done():
				return nil
			}
		}
		synced := []cache.InformerSynced{b.profileInformer.HasSynced, b.decisionInformer.HasSynced, b.namespaceInformer.HasSynced}
		if b.in != nil {
			for _, k := range b.in.kinds {
				synced = append(synced, k.inf.HasSynced)
			}
		}
		if !cache.WaitForCacheSync(ctx.Done(), synced...) {
			return nil
		}
		b.readyOnce.Do(func() { close(b.ready) })
		// Only the holder of the hub's lease writes (the CRDs and the namespace above are
		// created alike by any bridge): the controllers run while it is held, and start again
		// with a fresh queue, every key, when it is regained.
		return lease.Run(ctx, b.js, b.leaseName, lease.DefaultHolder(), lease.DefaultTTL, b.lead, lease.WithLogger(b.log),
			lease.WithReplicas(b.cfg.leaseReplicas))
	})
	return g.Wait()
}

// lead runs the controllers while this bridge holds the lease.
func (b *Bridge) lead(ctx context.Context) error {
	b.leading.Store(true)
	b.leader.Set(1)
	defer func() { b.leading.Store(false); b.leader.Set(0) }()
	g, ctx := errgroup.WithContext(ctx)
	if b.inbound != nil {
		g.Go(func() error { return b.inbound.Run(ctx) })
	}
	g.Go(func() error {
		return b.profiles.Run(ctx, reconcile.Watch(b.clusters, func(u view.Update[*clusterv1.Cluster]) []string {
			return []string{u.Value.GetName()}
		}))
	})
	g.Go(func() error { return b.placements.Run(ctx, reconcile.Watch(b.decisions, nil)) })
	b.log.Info("holding the hub's lease: publishing the fleet to the hub", zap.String("lease", b.leaseName), zap.String("namespace", b.cfg.Namespace))
	return g.Wait()
}

// identifyHub names the bridge's lease after the hub: the uid of its kube-system namespace,
// which every API server creates at its first start and keeps.
func (b *Bridge) identifyHub(ctx context.Context) error {
	ns, err := b.kube.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return err
	}
	b.leaseName = LeasePrefix + "." + string(ns.UID)
	return nil
}

// retry calls fn until it succeeds or ctx ends, backing off from 1 s to 30 s.
func (b *Bridge) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	delay := time.Second
	for {
		// Each attempt has its own deadline: a hub that accepts the connection and never
		// answers would otherwise hold the bridge here for good, unlogged.
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		err := fn(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		b.log.Warn("hub: "+what+" failed; retrying", zap.Duration("in", delay), zap.Error(err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// ensureNamespace creates the ClusterProfiles' namespace if it is missing; one that exists is
// left as it is (an admin's).
func (b *Bridge) ensureNamespace(ctx context.Context) error {
	_, err := b.kube.CoreV1().Namespaces().Get(ctx, b.cfg.Namespace, metav1.GetOptions{})
	if err == nil {
		return nil
	}
	if !isNotFound(err) {
		return err
	}
	_, err = b.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: b.cfg.Namespace, Labels: map[string]string{LabelManagedBy: FieldManager}}}, metav1.CreateOptions{FieldManager: FieldManager})
	if isAlreadyExists(err) {
		return nil
	}
	return err
}

// Informer indexes.
const (
	byPlacement = "placement" // PlacementDecisions by keys.Join(project, placement)
	byProject   = "project"   // namespaces by the project they are mapped to
)

func placementIndex(obj any) ([]string, error) {
	if k := placementKeyOf(obj); k != "" {
		return []string{k}, nil
	}
	return nil, nil
}

func projectIndex(obj any) ([]string, error) {
	if p := labelOf(obj, LabelProject); p != "" {
		return []string{p}, nil
	}
	return nil, nil
}

// placementKeyOf is the decisions view's key of a PlacementDecision the bridge wrote.
func placementKeyOf(obj any) string {
	project, placement := labelOf(obj, LabelProject), labelOf(obj, ocmv1beta1.PlacementLabel)
	if project == "" || placement == "" {
		return ""
	}
	return keys.Join(project, placement)
}

func labelOf(obj any, key string) string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if m, ok := obj.(metav1.Object); ok {
		return m.GetLabels()[key]
	}
	return ""
}

func objectName(obj any) string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if m, ok := obj.(metav1.Object); ok {
		return m.GetName()
	}
	return ""
}

// handler calls queue with the object of every add, update and delete.
func handler(queue func(obj any)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    queue,
		UpdateFunc: func(old, obj any) { queue(old); queue(obj) },
		DeleteFunc: queue,
	}
}

// stored returns the object of the informer's store at namespace/name.
func stored(inf cache.SharedIndexInformer, namespace, name string) *unstructured.Unstructured {
	key := name // a cluster-scoped object's
	if namespace != "" {
		key = namespace + "/" + name
	}
	obj, ok, err := inf.GetStore().GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	u, _ := obj.(*unstructured.Unstructured)
	return u
}

// gvk of a resource the bridge writes, for messages.
func gvk(gvr schema.GroupVersionResource) string { return gvr.Resource + "." + gvr.Group }
