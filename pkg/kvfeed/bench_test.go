package kvfeed_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetstream/fleetstream/pkg/kvfeed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// BenchmarkChangeOnEveryCluster is the cost behind "grant → applied on every cluster" (issue
// 26): N clusters each watch their own keys of one bucket (5 keys each), and one change is
// written for every cluster; an op is the time until every watcher has received its change.
//
//	consumer: a jetstream KV watch per cluster, as agents did (one ordered consumer each, which
//	          nats-server matches against every stored message: N² per round);
//	feed:     kvfeed (the replay consumer gone once settled; the bucket's republish reaches
//	          each cluster's subscription through the subject tree).
//
// go test -run '^$' -bench ChangeOnEveryCluster -benchtime 20x ./kvfeed/
func BenchmarkChangeOnEveryCluster(b *testing.B) {
	for _, n := range []int{100, 500, 990} {
		for _, design := range []string{"consumer", "feed"} {
			b.Run(fmt.Sprintf("clusters=%d/%s", n, design), func(b *testing.B) {
				benchChange(b, n, design)
			})
		}
	}
}

func benchChange(b *testing.B, n int, design string) {
	j := testkit.StartJetStream(b)
	ctx := testkit.Context(b, 10*time.Minute)
	kv, err := j.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, RePublish: subjects.FeedRePublish(bucket)})
	if err != nil {
		b.Fatal(err)
	}
	for c := range n {
		for k := range 5 {
			if _, err := kv.PutString(ctx, fmt.Sprintf("c%d.k%d", c, k), "0"); err != nil {
				b.Fatal(err)
			}
		}
	}
	// Watchers share a few connections, as agents share a NATS server's capacity.
	var conns []jetstream.JetStream
	for range 8 {
		_, js := j.Connect(b)
		conns = append(conns, js)
	}
	var (
		mu      sync.Mutex
		cond    = sync.NewCond(&mu)
		reached = map[int]int{} // round → watchers that saw it
	)
	ready := sync.WaitGroup{}
	for c := range n {
		js := conns[c%len(conns)]
		filter := fmt.Sprintf("c%d.>", c)
		var updates <-chan jetstream.KeyValueEntry
		switch design {
		case "consumer":
			kvc, err := js.KeyValue(ctx, bucket)
			if err != nil {
				b.Fatal(err)
			}
			w, err := kvc.Watch(ctx, filter)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = w.Stop() })
			updates = w.Updates()
		case "feed":
			w, err := kvfeed.Watch(ctx, js, bucket, filter, kvfeed.Options{Settle: 100 * time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = w.Stop() })
			updates = w.Updates()
		}
		ready.Add(1)
		go func() {
			for e := range updates {
				if e == nil {
					ready.Done()
					continue
				}
				round, _ := strconv.Atoi(string(e.Value()))
				if round > 0 && e.Key() == filter[:len(filter)-1]+"k0" {
					mu.Lock()
					reached[round]++
					cond.Broadcast()
					mu.Unlock()
				}
			}
		}()
	}
	ready.Wait()
	time.Sleep(200 * time.Millisecond) // every feed settled: only the steady state is timed
	if design == "feed" {
		if got := consumers(b, j.JS); got != 0 {
			b.Fatalf("%d consumers after settling", got)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		round := i + 1
		// Written as the fan-out writes a grant: asynchronously, acknowledged as a batch.
		for c := range n {
			if _, err := j.JS.PublishAsync(fmt.Sprintf("$KV.%s.c%d.k0", bucket, c), []byte(strconv.Itoa(round))); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-j.JS.PublishAsyncComplete():
		case <-ctx.Done():
			b.Fatal("writes not acknowledged")
		}
		mu.Lock()
		for reached[round] < n {
			cond.Wait()
		}
		mu.Unlock()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(n), "µs/cluster")
}
