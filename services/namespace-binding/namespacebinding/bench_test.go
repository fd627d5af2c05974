package namespacebinding_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/pkg/view"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
	"github.com/fleetstream/fleetstream/services/namespace-binding/namespacebinding"
)

// BenchmarkBindNamespaces binds 10,000 namespaces (each with a quota, so 20,000 desired
// objects) over 100 registered clusters through the API, and measures the time until every
// desired object is in the desired bucket. The baseline, in the same run on the same server:
// the same number of objects of the same size written as plain KV puts by as many concurrent
// writers.
//
// The cases differ in how the binds spread over projects, because every command on a project
// appends to the project's one subject with an optimistic-concurrency expectation, so a
// project's binds are appended one at a time: "spread" sends consecutive binds to 100
// different projects (many teams at once), "one-project" sends all of them to one project (a
// team onboarding its namespaces), "spread-128" is "spread" with 128 callers.
//
//	cd services/namespace-binding && go test -run '^$' -bench BindNamespaces -benchtime 1x -count 3 ./namespacebinding/
func BenchmarkBindNamespaces(b *testing.B) {
	for _, c := range []struct {
		name              string
		projects, callers int
	}{
		{"spread", 100, 32},
		{"one-project", 1, 32},
		{"spread-128", 100, 128},
	} {
		b.Run(c.name, func(b *testing.B) { benchmarkBindNamespaces(b, c.projects, c.callers) })
	}
}

func benchmarkBindNamespaces(b *testing.B, projects, writers int) {
	const (
		clusters   = 100
		namespaces = 10_000
		objects    = 2 * namespaces // a Namespace and a ResourceQuota each
	)
	for range b.N {
		b.StopTimer()
		j := testkit.StartJetStream(b)
		e := startHub(b, j, namespacebinding.Config{}, clusterimport.Config{})
		ctx := testkit.Context(b, 10*time.Minute)
		for i := range clusters {
			e.register(b, fmt.Sprintf("c%03d", i))
		}
		for i := range projects {
			e.createProject(b, fmt.Sprintf("p%03d", i))
		}
		hard := map[string]string{"cpu": "1", "memory": "1Gi"}

		// Count the desired objects as they land, from a watch started before the first bind.
		desired := e.kv(b, subjects.DesiredNamespacesBucket)
		all := make(chan time.Time, 1)
		w, err := desired.WatchAll(ctx, jetstream.UpdatesOnly())
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			seen := map[string]bool{}
			for en := range w.Updates() {
				if en == nil || en.Key() == view.MetaKey {
					continue
				}
				seen[en.Key()] = true
				if len(seen) == objects {
					all <- time.Now()
					return
				}
			}
		}()

		b.StartTimer()
		start := time.Now()
		var next atomic.Int64
		var failed atomic.Int64
		var wg sync.WaitGroup
		for range writers {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= namespaces {
						return
					}
					// Consecutive requests go to different clusters and, when there are
					// several, different projects, as many teams working at once would.
					_, err := e.client.BindNamespace(ctx, connect.NewRequest(&projectv1.BindNamespaceRequest{
						Project: fmt.Sprintf("p%03d", i%projects), Cluster: fmt.Sprintf("c%03d", (i/projects)%clusters),
						Namespace: fmt.Sprintf("ns-%05d", i), Hard: hard}))
					if err != nil && failed.Add(1) <= 5 {
						b.Errorf("bind %d: %v", i, err)
					}
				}
			})
		}
		wg.Wait()
		apiDone := time.Since(start)
		if n := failed.Load(); n > 0 {
			b.Fatalf("%d of %d binds failed", n, namespaces)
		}
		var ours time.Duration
		select {
		case at := <-all:
			ours = at.Sub(start)
		case <-ctx.Done():
			b.Fatal("desired objects did not all arrive")
		}
		_ = w.Stop()
		b.StopTimer()

		// Baseline: raw KV puts of objects of the same size, same concurrency, same server.
		sample, err := desired.Get(ctx, subjects.DesiredKey("c000", "ResourceQuota", "ns-00000", namespacebinding.QuotaName))
		if err != nil {
			b.Fatal(err)
		}
		payload := sample.Value()
		raw, err := j.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "bench-raw", History: 1, Storage: jetstream.FileStorage})
		if err != nil {
			b.Fatal(err)
		}
		next.Store(0)
		rawStart := time.Now()
		for range writers {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= objects {
						return
					}
					if _, err := raw.Put(ctx, fmt.Sprintf("c%03d.k%05d", i%clusters, i), payload); err != nil {
						b.Errorf("raw put %d: %v", i, err)
					}
				}
			})
		}
		wg.Wait()
		rawTime := time.Since(rawStart)

		oursRate := float64(objects) / ours.Seconds()
		rawRate := float64(objects) / rawTime.Seconds()
		b.ReportMetric(ours.Seconds(), "s-all-desired")
		b.ReportMetric(oursRate, "desired-objects/s")
		b.ReportMetric(float64(namespaces)/apiDone.Seconds(), "binds/s")
		b.ReportMetric(rawRate, "raw-kv-puts/s")
		b.ReportMetric(oursRate/rawRate, "ratio")
		b.Logf("%d binds (%d desired objects, %d B each) over %d clusters and %d projects, %d callers: API done in %s, all desired in %s (%.0f objects/s); raw KV puts: %s (%.0f/s); ratio %.2f",
			namespaces, objects, len(payload), clusters, projects, writers, apiDone.Round(time.Millisecond), ours.Round(time.Millisecond), oursRate,
			rawTime.Round(time.Millisecond), rawRate, oursRate/rawRate)
	}
}
