package rbacsync_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1k "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	desiredv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/desired/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/rbac-sync/rbacsync"
)

// Shape of benchmark (a): one project with benchNamespaces namespaces on each of benchClusters
// clusters, so one binding fans out into benchClusters × benchNamespaces RoleBindings.
const (
	benchClusters   = 100
	benchNamespaces = 20
	benchRounds     = 200 // enough grants and revocations per run for a p99 (≥ 200 samples)
)

// rbWatch follows the RoleBindings of a desired bucket and tells when every one of them does
// (or, for a revocation, no longer does) list a subject. It keeps the last value of each key,
// so the raw baseline can write the very bytes ours wrote.
type rbWatch struct {
	mu      sync.Mutex
	has     map[string]map[string]bool // key -> subject names
	count   map[string]int             // subject -> keys listing it
	vals    map[string][]byte          // key -> last value
	changed chan struct{}
}

func watchRoleBindings(tb testing.TB, ctx context.Context, kv jetstream.KeyValue) *rbWatch {
	w := &rbWatch{has: map[string]map[string]bool{}, count: map[string]int{}, vals: map[string][]byte{}, changed: make(chan struct{})}
	kw, err := kv.Watch(ctx, "*.RoleBinding.>")
	if err != nil {
		tb.Fatal(err)
	}
	go func() {
		defer func() { _ = kw.Stop() }()
		for e := range kw.Updates() {
			if e == nil {
				continue
			}
			subs := map[string]bool{}
			obj := &desiredv1.DesiredObject{}
			if e.Operation() == jetstream.KeyValuePut && proto.Unmarshal(e.Value(), obj) == nil && !obj.Tombstone {
				for _, name := range subjectNames(obj.Manifest) {
					subs[name] = true
				}
			}
			w.mu.Lock()
			for s := range w.has[e.Key()] {
				w.count[s]--
			}
			for s := range subs {
				w.count[s]++
			}
			w.has[e.Key()] = subs
			w.vals[e.Key()] = e.Value()
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
	}()
	return w
}

// subjectNames picks the subject names out of a RoleBinding manifest without a full JSON
// decode: the watcher shares the machine with what it measures.
func subjectNames(manifest []byte) []string {
	i := bytes.Index(manifest, []byte(`"subjects":`))
	if i < 0 {
		return nil
	}
	rest := manifest[i:]
	var out []string
	for {
		j := bytes.Index(rest, []byte(`"name":"`))
		if j < 0 {
			return out
		}
		rest = rest[j+8:]
		k := bytes.IndexByte(rest, '"')
		out = append(out, string(rest[:k]))
		rest = rest[k:]
	}
}

// wait blocks until n keys list subject (present) or none does (!present).
func (w *rbWatch) wait(ctx context.Context, subject string, present bool, n int) error {
	for {
		w.mu.Lock()
		count := w.count[subject]
		ch := w.changed
		w.mu.Unlock()
		if present && count == n || !present && count == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d RoleBindings list %s: %w", count, subject, ctx.Err())
		case <-ch:
		}
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// values returns a copy of the last value of every key the watch has seen.
func (w *rbWatch) values() map[string][]byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.vals)
}

// rawKVWrite writes vals into kv the way a hand-written fan-out would, pipelined publishes to
// the bucket's subjects, and returns the time from the first publish until the watch w of kv
// sees subject listed by n keys (present) or by none: the same kind of watch that times ours.
func rawKVWrite(tb testing.TB, ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, w *rbWatch, vals map[string][]byte, subject string, present bool, n int) time.Duration {
	msgs := make([]*nats.Msg, 0, len(vals))
	for key, val := range vals {
		m := nats.NewMsg("$KV." + kv.Bucket() + "." + key)
		m.Data = val
		msgs = append(msgs, m)
	}
	start := time.Now()
	futs := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		var err error
		if futs[i], err = js.PublishMsgAsync(m); err != nil {
			tb.Fatal(err)
		}
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			tb.Fatal(err)
		}
	}
	if err := w.wait(ctx, subject, present, n); err != nil {
		tb.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkBindingFanOut is benchmark (a): a project role binding added to (and removed from) a
// project with 20 namespaces on each of 100 registered clusters, timed from the API call until
// a KV watch sees all 2,000 desired RoleBindings in bucket desired-rbac list (no longer list)
// the subject, over benchRounds grants and as many revocations. The baseline, in the same run
// on the same server: after each of ours, the 2,000 values ours wrote, written to a bucket of
// the same configuration with pipelined publishes, timed from the first publish until the same
// kind of watch on that bucket sees them (rawKVWrite). Reported: p50 and p99 of both sides and
// the ratios p50/p50 and p99/p99.
func BenchmarkBindingFanOut(b *testing.B) {
	e := start(b, nil, rbacsync.Config{})
	ctx := testkit.Context(b, 20*time.Minute)
	var clusters []string
	for c := range benchClusters {
		clusters = append(clusters, fmt.Sprintf("c%03d", c))
	}
	e.register(b, clusters...)
	e.createProject(b, "big")
	for _, c := range clusters {
		for n := range benchNamespaces {
			e.bindNS(b, "big", c, fmt.Sprintf("ns%02d", n))
		}
	}
	e.createTemplate(b, "viewer", nil, rule("", "pods", "get", "list"))
	// A standing member, so a revocation changes RoleBindings rather than deleting them.
	e.bindRole(b, "big", user("owner"), "viewer")
	total := benchClusters * benchNamespaces
	w := watchRoleBindings(b, ctx, e.desired)
	if err := w.wait(ctx, "owner", true, total); err != nil {
		b.Fatal(err)
	}
	// The baseline's bucket, with the same configuration as desired-rbac (the history and
	// republish agents follow it by: both cost the store on every write) and the same watch.
	rawKV, err := e.js.JS.CreateKeyValue(ctx, subjects.FeedBucketConfig("bench-raw", "BindingFanOut's baseline"))
	if err != nil {
		b.Fatal(err)
	}
	rw := watchRoleBindings(b, ctx, rawKV)
	var grants, revokes, rawGrants, rawRevokes []time.Duration
	b.ResetTimer()
	for range b.N {
		for r := range benchRounds {
			subject := fmt.Sprintf("user-%d", r)
			t0 := time.Now()
			e.bindRole(b, "big", user(subject), "viewer")
			if err := w.wait(ctx, subject, true, total); err != nil {
				b.Fatal(err)
			}
			grants = append(grants, time.Since(t0))
			granted := w.values()
			t0 = time.Now()
			e.unbindRole(b, "big", user(subject), "viewer")
			if err := w.wait(ctx, subject, false, total); err != nil {
				b.Fatal(err)
			}
			revokes = append(revokes, time.Since(t0))
			revoked := w.values()
			rawGrants = append(rawGrants, rawKVWrite(b, ctx, e.js.JS, rawKV, rw, granted, subject, true, total))
			rawRevokes = append(rawRevokes, rawKVWrite(b, ctx, e.js.JS, rawKV, rw, revoked, subject, false, total))
		}
	}
	b.StopTimer()
	p := func(d []time.Duration, q float64) float64 { return ms(percentile(d, q)) }
	b.ReportMetric(p(grants, 0.5), "grant_p50_ms")
	b.ReportMetric(p(grants, 0.99), "grant_p99_ms")
	b.ReportMetric(p(revokes, 0.5), "revoke_p50_ms")
	b.ReportMetric(p(revokes, 0.99), "revoke_p99_ms")
	b.ReportMetric(p(rawGrants, 0.5), "raw_grant_p50_ms")
	b.ReportMetric(p(rawGrants, 0.99), "raw_grant_p99_ms")
	b.ReportMetric(p(rawRevokes, 0.5), "raw_revoke_p50_ms")
	b.ReportMetric(p(rawRevokes, 0.99), "raw_revoke_p99_ms")
	b.ReportMetric(p(grants, 0.5)/p(rawGrants, 0.5), "grant_p50/raw_p50")
	b.ReportMetric(p(grants, 0.99)/p(rawGrants, 0.99), "grant_p99/raw_p99")
	b.ReportMetric(p(revokes, 0.5)/p(rawRevokes, 0.5), "revoke_p50/raw_p50")
	b.ReportMetric(p(revokes, 0.99)/p(rawRevokes, 0.99), "revoke_p99/raw_p99")
	b.Logf("%d grants and %d revocations (p99 of ≥ 200 samples each)", len(grants), len(revokes))
}

func BenchmarkGrantRevokeOnClusters(b *testing.B) {
	const namespaces, rounds = 50, 10
	e := start(b, nil, rbacsync.Config{})
	ctx := testkit.Context(b, 20*time.Minute)
	var members []*member
	for i := range 3 {
		members = append(members, startMemberTB(b, e, fmt.Sprintf("m%d", i)))
	}
	e.createProject(b, "big")
	var nsNames []string
	for n := range namespaces {
		nsNames = append(nsNames, fmt.Sprintf("ns%02d", n))
	}
	for _, m := range members {
		e.bindNS(b, "big", m.name, nsNames...)
	}
	e.createTemplate(b, "viewer", nil, rule("", "pods", "get", "list"))
	e.createTemplate(b, "direct", nil, rule("", "pods", "get", "list"))
	e.bindRole(b, "big", user("owner"), "viewer")
	// Everything in place (namespaces created by the agents, standing RoleBindings applied).
	if err := agree(ctx, members, nsNames, "owner", true); err != nil {
		b.Fatal(err)
	}
	// The hub's part, for the breakdown: until the desired RoleBindings are written.
	w := watchRoleBindings(b, ctx, e.desired)
	var grants, revokes, directs, hub []time.Duration
	b.ResetTimer()
	for range b.N {
		for r := range rounds {
			subject := fmt.Sprintf("user-%d", r)
			t0 := time.Now()
			e.bindRole(b, "big", user(subject), "viewer")
			if err := w.wait(ctx, subject, true, len(members)*namespaces); err != nil {
				b.Fatal(err)
			}
			hub = append(hub, time.Since(t0))
			if err := agree(ctx, members, nsNames, subject, true); err != nil {
				b.Fatal(err)
			}
			grants = append(grants, time.Since(t0))
			t0 = time.Now()
			e.unbindRole(b, "big", user(subject), "viewer")
			if err := agree(ctx, members, nsNames, subject, false); err != nil {
				b.Fatal(err)
			}
			revokes = append(revokes, time.Since(t0))
			d, err := direct(ctx, members, nsNames, "direct-"+subject)
			if err != nil {
				b.Fatal(err)
			}
			directs = append(directs, d)
		}
	}
	b.StopTimer()
	floor := percentile(directs, 0.5)
	b.ReportMetric(ms(percentile(grants, 0.5)), "grant_p50_ms")
	b.ReportMetric(ms(percentile(grants, 0.99)), "grant_p99_ms")
	b.ReportMetric(ms(percentile(revokes, 0.5)), "revoke_p50_ms")
	b.ReportMetric(ms(percentile(revokes, 0.99)), "revoke_p99_ms")
	b.ReportMetric(ms(percentile(hub, 0.5)), "hub_grant_p50_ms")
	b.ReportMetric(ms(floor), "direct_p50_ms")
	b.ReportMetric(ms(max(percentile(grants, 0.99), percentile(revokes, 0.99)))/ms(floor), "p99/direct")
}

// agree waits until SubjectAccessReview on every member says subject may (or may not) list pods
// in every namespace, asking only about namespaces that do not agree yet, in parallel.
func agree(ctx context.Context, members []*member, namespaces []string, subject string, want bool) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(members))
	for _, m := range members {
		wg.Go(func() {
			pending := slices.Clone(namespaces)
			for len(pending) > 0 {
				var next []string
				var mu sync.Mutex
				var inner sync.WaitGroup
				sem := make(chan struct{}, 16)
				for _, ns := range pending {
					inner.Go(func() {
						sem <- struct{}{}
						defer func() { <-sem }()
						ok, err := m.kube.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
							Spec: authorizationv1.SubjectAccessReviewSpec{User: subject, ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "list", Resource: "pods"}},
						}, metav1.CreateOptions{})
						if err != nil || ok.Status.Allowed != want {
							mu.Lock()
							next = append(next, ns)
							mu.Unlock()
						}
					})
				}
				inner.Wait()
				pending = next
				if len(pending) > 0 {
					select {
					case <-ctx.Done():
						errs <- fmt.Errorf("%s: %d namespaces disagree on %s: %w", m.name, len(pending), subject, ctx.Err())
						return
					case <-time.After(2 * time.Millisecond):
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// direct creates one RoleBinding per namespace of every member with client-go (all clusters
// and namespaces in parallel, 16 at a time per cluster), waits for SubjectAccessReview to agree,
// deletes them and waits again: the Kubernetes floor of a grant plus a revocation, halved to
// compare with one of ours.
func direct(ctx context.Context, members []*member, namespaces []string, subject string) (time.Duration, error) {
	do := func(create bool) error {
		var wg sync.WaitGroup
		errs := make(chan error, len(members)*len(namespaces))
		for _, m := range members {
			sem := make(chan struct{}, 16)
			for _, ns := range namespaces {
				wg.Go(func() {
					sem <- struct{}{}
					defer func() { <-sem }()
					rbs := m.kube.Client.RbacV1().RoleBindings(ns)
					var err error
					if create {
						_, err = rbs.Create(ctx, &rbacv1k.RoleBinding{
							ObjectMeta: metav1.ObjectMeta{Name: subject},
							RoleRef:    rbacv1k.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: rbacsync.ObjectName("direct")},
							Subjects:   []rbacv1k.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: subject}},
						}, metav1.CreateOptions{})
					} else {
						err = rbs.Delete(ctx, subject, metav1.DeleteOptions{})
					}
					if err != nil {
						errs <- err
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	t0 := time.Now()
	if err := do(true); err != nil {
		return 0, err
	}
	if err := agree(ctx, members, namespaces, subject, true); err != nil {
		return 0, err
	}
	if err := do(false); err != nil {
		return 0, err
	}
	if err := agree(ctx, members, namespaces, subject, false); err != nil {
		return 0, err
	}
	return time.Since(t0) / 2, nil
}
