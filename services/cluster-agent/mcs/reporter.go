// Package mcs is the agent side of multi-cluster Services (KEP-1645, docs/kubernetes.md): it
// watches the member cluster's ServiceExports (multicluster.x-k8s.io/v1alpha1) in the
// namespaces the agent bound for a project, reports each namespace's exports with what the hub
// needs of their Services on fleet.agent.<cluster>.serviceexports.<namespace>, and writes the
// hub's verdict on each export as its Conflict condition. The ServiceImports and EndpointSlices
// the hub computes arrive as desired state (bucket desired-mcs) and are applied by package
// desired, like RoleBindings.
//
// Types and CRDs are upstream's: sigs.k8s.io/mcs-api v0.5.2.
package mcs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	mcsv1alpha1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/mcs"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// Appender publishes one report; *events.Store is one.
type Appender interface {
	Append(ctx context.Context, subject, aggregateID string, expect events.Expect, payload proto.Message) (uint64, error)
}

// The resources the reporter reads.
var (
	ExportsGVR = mcsv1alpha1.SchemeGroupVersion.WithResource("serviceexports")
	ImportsGVR = mcsv1alpha1.SchemeGroupVersion.WithResource("serviceimports")
)

// What marks a namespace (and an import) the agent manages: package desired's label.
const (
	managedByLabel = "app.kubernetes.io/managed-by"
	managedByValue = "fleetstream"
	// fieldManager writes the Conflict condition of exports.
	fieldManager = "fleetstream-agent"
)

// Defaults for zero Config fields.
const (
	DefaultResync     = 10 * time.Minute
	DefaultCRDRecheck = 30 * time.Second
)

// Config configures a Reporter.
type Config struct {
	ClusterName string
	// SessionID identifies the agent process; reports carry it and the sync marker names it.
	SessionID string
	// MaxExports bounds one namespace's report (default and at most mcs.MaxExportsPerReport).
	MaxExports int
	// MaxBytes bounds one report's encoding (default and at most mcs.MaxReportBytes).
	MaxBytes int
	// Resync republishes every namespace's exports and the marker this often (default 10m).
	Resync time.Duration
	// CRDRecheck is how often the reporter looks again for the ServiceExport CRD while the
	// cluster has none (default 30s): MCS is optional, and installed when a team wants it.
	CRDRecheck time.Duration
}

func (c *Config) defaults() error {
	if c.ClusterName == "" {
		return errors.New("cluster name is required")
	}
	if c.MaxExports <= 0 || c.MaxExports > mcs.MaxExportsPerReport {
		c.MaxExports = mcs.MaxExportsPerReport
	}
	if c.MaxBytes <= 0 || c.MaxBytes > mcs.MaxReportBytes {
		c.MaxBytes = mcs.MaxReportBytes
	}
	if c.Resync <= 0 {
		c.Resync = DefaultResync
	}
	if c.CRDRecheck <= 0 {
		c.CRDRecheck = DefaultCRDRecheck
	}
	return nil
}

// relistKey asks the worker to report every namespace and then the sync marker; NUL is in no
// namespace name.
const relistKey = "\x00relist"

// resend marks a namespace's last report as one to send again: no report encodes to it.
const resend = "\x00resend"

// Reporter reports ServiceExports and writes their Conflict conditions.
type Reporter struct {
	cfg  Config
	kube kubernetes.Interface
	dyn  dynamic.Interface
	disc discovery.DiscoveryInterface
	app  Appender
	log  *zap.Logger

	queue workqueue.TypedRateLimitingInterface[string]
	// status is the queue of exports (namespace/name) whose Conflict condition to write: its
	// own worker, so that a namespace of a thousand exports writing their conditions (at the
	// client's rate limit) never holds up another namespace's report.
	status workqueue.TypedRateLimitingInterface[string]

	namespaces cache.GenericLister
	services   cache.GenericLister
	exports    cache.GenericLister
	imports    cache.GenericLister

	// Owned by the worker.
	sent    map[string]string // namespace → the last report's content (without its time)
	omitted map[string]bool   // namespaces whose last report left exports out (logged once)

	// judged is, by namespace, the exports the last pass considered (the oldest MaxExports)
	// and why each is not valid ("" for one the report carried): only those get conditions.
	mu     sync.Mutex
	judged map[string]map[string]string
}

// New returns a reporter of cfg.ClusterName's exports, published through app.
func New(cfg Config, kube kubernetes.Interface, dyn dynamic.Interface, app Appender, log *zap.Logger) (*Reporter, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("mcs reporter config: %w", err)
	}
	if kube == nil || dyn == nil || app == nil {
		return nil, errors.New("mcs reporter: kubernetes, dynamic clients and appender are required")
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Reporter{cfg: cfg, kube: kube, dyn: dyn, disc: kube.Discovery(), app: app, log: log.Named("mcs"),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "mcs-exports-" + cfg.ClusterName}),
		status: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "mcs-export-status-" + cfg.ClusterName}),
		sent: map[string]string{}, omitted: map[string]bool{}, judged: map[string]map[string]string{}}, nil
}

// Run waits until the cluster serves ServiceExports, then reports until ctx ends. A cluster
// without the CRD costs a discovery request every CRDRecheck.
func (r *Reporter) Run(ctx context.Context) error {
	defer r.queue.ShutDown()
	defer r.status.ShutDown()
	if !r.waitForCRD(ctx) {
		return nil
	}
	factory := informers.NewSharedInformerFactory(r.kube, 0)
	nsInf := factory.Core().V1().Namespaces().Informer()
	svcInf := factory.Core().V1().Services().Informer()
	dfactory := dynamicinformer.NewDynamicSharedInformerFactory(r.dyn, 0)
	expInf := dfactory.ForResource(ExportsGVR)
	impInf := dynamicinformer.NewFilteredDynamicInformer(r.dyn, ImportsGVR, metav1.NamespaceAll, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		func(o *metav1.ListOptions) { o.LabelSelector = managedByLabel + "=" + managedByValue })
	r.namespaces = cache.NewGenericLister(nsInf.GetIndexer(), corev1.Resource("namespaces"))
	r.services = cache.NewGenericLister(svcInf.GetIndexer(), corev1.Resource("services"))
	r.exports = expInf.Lister()
	r.imports = impInf.Lister()
	byNamespace := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if o, ok := obj.(metav1.Object); ok {
			ns := o.GetNamespace()
			if ns == "" { // a Namespace
				ns = o.GetName()
			}
			r.queue.Add(ns)
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: byNamespace, UpdateFunc: func(_, n any) { byNamespace(n) }, DeleteFunc: byNamespace}
	for _, inf := range []cache.SharedIndexInformer{nsInf, svcInf, expInf.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("mcs informer: %w", err)
		}
	}
	// An import (the hub's verdict) or an export changing queues that export's condition.
	byObject := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if o, ok := obj.(metav1.Object); ok {
			r.status.Add(o.GetNamespace() + "/" + o.GetName())
		}
	}
	hs := cache.ResourceEventHandlerFuncs{AddFunc: byObject, UpdateFunc: func(_, n any) { byObject(n) }, DeleteFunc: byObject}
	for _, inf := range []cache.SharedIndexInformer{expInf.Informer(), impInf.Informer()} {
		if _, err := inf.AddEventHandler(hs); err != nil {
			return fmt.Errorf("mcs informer: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	factory.Start(ctx.Done())
	dfactory.Start(ctx.Done())
	go impInf.Informer().RunWithContext(ctx)
	defer factory.Shutdown()
	defer dfactory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nsInf.HasSynced, svcInf.HasSynced, expInf.Informer().HasSynced, impInf.Informer().HasSynced) {
		return nil
	}
	r.log.Info("reporting multi-cluster ServiceExports")
	r.queue.Add(relistKey)
	go func() {
		t := time.NewTicker(r.cfg.Resync)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				r.queue.Add(relistKey)
			}
		}
	}()
	go func() {
		<-ctx.Done()
		r.queue.ShutDown()
		r.status.ShutDown()
	}()
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		for r.processStatus(ctx) {
		}
	}()
	for r.processNext(ctx) {
	}
	<-statusDone
	return nil
}

func (r *Reporter) processStatus(ctx context.Context) bool {
	key, shutdown := r.status.Get()
	if shutdown {
		return false
	}
	defer r.status.Done(key)
	err := r.writeCondition(ctx, key)
	if err == nil {
		r.status.Forget(key)
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	r.log.Info("writing an export's condition failed; retrying", zap.String("export", key), zap.Error(err))
	r.status.AddRateLimited(key)
	return true
}

// waitForCRD returns once the cluster serves ServiceExports, false if ctx ended first.
func (r *Reporter) waitForCRD(ctx context.Context) bool {
	logged := false
	for {
		res, err := r.disc.ServerResourcesForGroupVersion(mcsv1alpha1.SchemeGroupVersion.String())
		if err == nil && slices.ContainsFunc(res.APIResources, func(a metav1.APIResource) bool { return a.Name == ExportsGVR.Resource }) {
			return true
		}
		if !logged {
			r.log.Info("the cluster serves no ServiceExports (multicluster.x-k8s.io/v1alpha1): multi-cluster Services are off until the CRD is installed", zap.Error(err))
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(r.cfg.CRDRecheck):
		}
	}
}

func (r *Reporter) processNext(ctx context.Context) bool {
	key, shutdown := r.queue.Get()
	if shutdown {
		return false
	}
	defer r.queue.Done(key)
	var err error
	if key == relistKey {
		err = r.relist(ctx)
	} else {
		err = r.reconcile(ctx, key)
	}
	if err == nil {
		r.queue.Forget(key)
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	r.log.Info("mcs report failed; retrying", zap.String("key", key), zap.Error(err))
	r.queue.AddRateLimited(key)
	return true
}

// relist reports every namespace with exports (whatever was sent before: a resync heals a
// report the hub lost), then the marker.
func (r *Reporter) relist(ctx context.Context) error {
	objs, err := r.exports.List(labels.Everything())
	if err != nil {
		return err
	}
	nss := map[string]bool{}
	for _, o := range objs {
		if m, ok := o.(metav1.Object); ok {
			nss[m.GetNamespace()] = true
		}
	}
	for ns := range r.sent {
		nss[ns] = true
		// Sent again whatever it holds: with exports, as they are; emptied since (an event
		// this process missed), empty.
		r.sent[ns] = resend
	}
	var errs []error
	n := 0
	for ns := range nss {
		if err := r.reconcile(ctx, ns); err != nil {
			errs = append(errs, err)
		}
		if r.sent[ns] != "" {
			n++
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return r.publish(ctx, subjects.AgentServiceExportsSync(r.cfg.ClusterName), events.Any, &endpointv1.ServiceExportsSync{
		ClusterName: r.cfg.ClusterName, SessionId: r.cfg.SessionID, Namespaces: uint32(n), Time: timestamppb.Now()})
}

// project returns the project owning namespace ns on this cluster, "" when the agent did not
// bind it.
func (r *Reporter) project(ns string) string {
	o, err := r.namespaces.Get(ns)
	if err != nil {
		return ""
	}
	n, ok := o.(*corev1.Namespace)
	if !ok || n.Labels[managedByLabel] != managedByValue || n.DeletionTimestamp != nil {
		return ""
	}
	return n.Labels[mcs.ProjectLabel]
}

// export is one ServiceExport as the reporter reads it.
type export struct {
	name    string
	uid     string
	gen     int64
	created metav1.Time
	status  mcsv1alpha1.ServiceExportStatus
}

func (r *Reporter) listExports(ns string) ([]export, error) {
	objs, err := r.exports.ByNamespace(ns).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := make([]export, 0, len(objs))
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok || u.GetDeletionTimestamp() != nil {
			continue
		}
		var se mcsv1alpha1.ServiceExport
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &se); err != nil {
			r.log.Debug("undecodable ServiceExport", zap.String("namespace", ns), zap.String("name", u.GetName()), zap.Error(err))
			continue
		}
		out = append(out, export{name: se.Name, uid: string(se.UID), gen: se.Generation, created: se.CreationTimestamp, status: se.Status})
	}
	// The oldest first, as KEP-1645 ranks exports: a bound keeps the exports that win.
	slices.SortFunc(out, func(a, b export) int {
		if c := a.created.Time.Compare(b.created.Time); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	return out, nil
}

// reconcile reports namespace ns's exports if they changed and writes their conditions.
func (r *Reporter) reconcile(ctx context.Context, ns string) error {
	var exps []export
	if r.project(ns) != "" {
		var err error
		if exps, err = r.listExports(ns); err != nil {
			return err
		}
	}
	rep := &endpointv1.ServiceExportsReport{ClusterName: r.cfg.ClusterName, Namespace: ns, SessionId: r.cfg.SessionID}
	// The oldest MaxExports exports are considered: each gets a Valid condition, and those
	// whose Service can be exported go into the report while it has room. The rest are
	// counted as omitted and left without conditions, so a flood costs at most MaxExports
	// condition writes per namespace.
	judged := map[string]string{}
	size := proto.Size(rep) + 64 // the time and the omitted count
	for i, e := range exps {
		if i >= r.cfg.MaxExports {
			rep.Omitted += uint32(len(exps) - i)
			break
		}
		es, invalid := r.exported(ns, e)
		if invalid != "" {
			judged[e.name] = invalid
			continue
		}
		n := proto.Size(es) + 8 // the field's tag and length
		if size+n > r.cfg.MaxBytes {
			rep.Omitted++
			continue
		}
		size += n
		rep.Exports = append(rep.Exports, es)
		judged[e.name] = ""
	}
	if rep.Omitted > 0 && !r.omitted[ns] {
		r.log.Warn("namespace has more ServiceExports than one report carries: the oldest are reported, the rest are not exported",
			zap.String("namespace", ns), zap.Int("reported", len(rep.Exports)), zap.Uint32("omitted", rep.Omitted))
	}
	r.omitted[ns] = rep.Omitted > 0
	content, err := proto.MarshalOptions{Deterministic: true}.Marshal(rep)
	if err != nil {
		return err
	}
	prev, had := r.sent[ns]
	// A namespace never reported with nothing to report stays unreported.
	if prev != string(content) && (had || len(rep.Exports) > 0 || rep.Omitted > 0) {
		rep.Time = timestamppb.Now()
		if err := r.publish(ctx, subjects.AgentServiceExports(r.cfg.ClusterName, ns), events.Any, rep); err != nil {
			return err
		}
		if len(rep.Exports) == 0 && rep.Omitted == 0 {
			delete(r.sent, ns)
		} else {
			r.sent[ns] = string(content)
		}
	}
	for name := range judged {
		r.status.Add(ns + "/" + name)
	}
	r.mu.Lock()
	if len(judged) == 0 {
		delete(r.judged, ns)
	} else {
		r.judged[ns] = judged
	}
	r.mu.Unlock()
	return nil
}

// exported returns what the report says of export e, or why its Service cannot be exported
// (a Valid condition's reason: none, or of type ExternalName, or too many ports).
func (r *Reporter) exported(ns string, e export) (*endpointv1.ExportedService, string) {
	o, err := r.services.ByNamespace(ns).Get(e.name)
	if err != nil {
		return nil, string(mcsv1alpha1.ServiceExportReasonNoService)
	}
	svc, ok := o.(*corev1.Service)
	if !ok || svc.Spec.Type == corev1.ServiceTypeExternalName || len(svc.Spec.Ports) > mcs.MaxPortsPerExport {
		return nil, string(mcsv1alpha1.ServiceExportReasonInvalidServiceType)
	}
	es := &endpointv1.ExportedService{Name: e.name, Uid: e.uid, Created: timestamppb.New(e.created.Time), Type: mcs.TypeClusterSetIP}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		es.Type = mcs.TypeHeadless
	}
	for _, p := range svc.Spec.Ports {
		ep := &endpointv1.EndpointPort{Name: p.Name, Port: uint32(p.Port), Protocol: string(p.Protocol)}
		if ep.Protocol == "" {
			ep.Protocol = string(corev1.ProtocolTCP)
		}
		if p.AppProtocol != nil {
			ep.AppProtocol = *p.AppProtocol
		}
		es.Ports = append(es.Ports, ep)
	}
	// The hub's own checks: an export it would refuse is not reported (the hub would refuse
	// the namespace's whole report, every export of it) but marked Valid=False here.
	if err := mcs.ValidateExport(es); err != nil {
		return nil, ReasonInvalidService + ": Service " + e.name + " cannot be exported: " + err.Error()
	}
	return es, ""
}

// ReasonInvalidService is the Valid condition's reason for an export whose Service fails the
// hub's checks of an export (mcs.ValidateExport); the message names the field.
const ReasonInvalidService = "InvalidService"

// writeCondition writes on export key (namespace/name) its Valid condition and, once the hub
// has judged it (the import of the export's name is on this cluster), its Conflict condition,
// for an export the last pass considered. Only conditions that change are written, so a
// settled namespace costs no API call.
func (r *Reporter) writeCondition(ctx context.Context, key string) error {
	ns, name, _ := strings.Cut(key, "/")
	r.mu.Lock()
	invalid, considered := r.judged[ns][name]
	r.mu.Unlock()
	if !considered {
		return nil
	}
	o, err := r.exports.ByNamespace(ns).Get(name)
	if err != nil {
		return nil // gone
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok || u.GetDeletionTimestamp() != nil {
		return nil
	}
	var se mcsv1alpha1.ServiceExport
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &se); err != nil {
		return nil
	}
	e := export{name: se.Name, uid: string(se.UID), gen: se.Generation, created: se.CreationTimestamp, status: se.Status}
	valid := metav1.Condition{Type: string(mcsv1alpha1.ServiceExportConditionValid), Status: metav1.ConditionTrue,
		Reason: string(mcsv1alpha1.ServiceExportReasonValid), Message: "Service " + name + " is exported", ObservedGeneration: e.gen}
	switch invalid {
	case "":
	case string(mcsv1alpha1.ServiceExportReasonNoService):
		valid.Status, valid.Reason, valid.Message = metav1.ConditionFalse, invalid, "this namespace has no Service "+name
	default:
		valid.Status, valid.Reason, valid.Message = metav1.ConditionFalse, invalid,
			fmt.Sprintf("Service %s cannot be exported: of type ExternalName, or with more than %d ports", name, mcs.MaxPortsPerExport)
		if reason, msg, ok := strings.Cut(invalid, ": "); ok {
			valid.Reason, valid.Message = reason, msg
		}
	}
	conds := []metav1.Condition{valid}
	if invalid == "" {
		if io, err := r.imports.ByNamespace(ns).Get(name); err == nil {
			if imp, ok := io.(*unstructured.Unstructured); ok {
				c := metav1.Condition{Type: string(mcsv1alpha1.ServiceExportConditionConflict), Status: metav1.ConditionFalse, Reason: mcs.ReasonNoConflicts,
					Message: "no conflict with the other clusters' exports of " + name, ObservedGeneration: e.gen}
				if v, ok := imp.GetAnnotations()[mcs.ConflictAnnotation]; ok {
					reason, msg, _ := strings.Cut(v, ": ")
					c.Status, c.Reason, c.Message = metav1.ConditionTrue, reason, msg
				}
				conds = append(conds, c)
			}
		}
	}
	return r.setConditions(ctx, ns, e, conds)
}

// setConditions applies conds as the export's conditions of this field manager (a condition
// it wrote before and conds leaves out goes), unless each is already as wanted.
func (r *Reporter) setConditions(ctx context.Context, ns string, e export, conds []metav1.Condition) error {
	// The export's conditions of the types this reporter writes must be exactly conds.
	same := true
	for _, typ := range []mcsv1alpha1.ServiceExportConditionType{mcsv1alpha1.ServiceExportConditionValid, mcsv1alpha1.ServiceExportConditionConflict} {
		i := slices.IndexFunc(conds, func(c metav1.Condition) bool { return c.Type == string(typ) })
		j := slices.IndexFunc(e.status.Conditions, func(c metav1.Condition) bool { return c.Type == string(typ) })
		switch {
		case i < 0:
			same = same && j < 0
		case j < 0:
			same = false
		default:
			w, c := conds[i], e.status.Conditions[j]
			same = same && c.Status == w.Status && c.Reason == w.Reason && c.Message == w.Message && c.ObservedGeneration == w.ObservedGeneration
		}
	}
	var applied []any
	for _, want := range conds {
		want.LastTransitionTime = metav1.Now()
		for _, c := range e.status.Conditions {
			if c.Type == want.Type && c.Status == want.Status {
				want.LastTransitionTime = c.LastTransitionTime
			}
		}
		applied = append(applied, map[string]any{
			"type": want.Type, "status": string(want.Status), "reason": want.Reason, "message": want.Message,
			"observedGeneration": want.ObservedGeneration, "lastTransitionTime": want.LastTransitionTime.UTC().Format(time.RFC3339),
		})
	}
	if same {
		return nil
	}
	patch := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mcsv1alpha1.SchemeGroupVersion.String(), "kind": "ServiceExport",
		"metadata": map[string]any{"name": e.name, "namespace": ns, "uid": e.uid},
		"status":   map[string]any{"conditions": applied},
	}}
	data, err := patch.MarshalJSON()
	if err != nil {
		return err
	}
	force := true
	_, err = r.dyn.Resource(ExportsGVR).Namespace(ns).Patch(ctx, e.name, types.ApplyPatchType, data,
		metav1.PatchOptions{FieldManager: fieldManager, Force: &force}, "status")
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or replaced by a new export: its own events queue it again
	}
	if err != nil {
		return fmt.Errorf("write the conditions of ServiceExport %s/%s: %w", ns, e.name, err)
	}
	return nil
}

const publishTimeout = 10 * time.Second

func (r *Reporter) publish(ctx context.Context, subject string, expect events.Expect, msg proto.Message) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	if _, err := r.app.Append(ctx, subject, r.cfg.ClusterName, expect, msg); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return nil
}
