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

// BenchmarkReplayOneCluster is the replay an agent makes when it (re)connects, the storm's unit
// (issue 26, docs/scale.md "What is next: the replays' filtered scans"): one cluster's 10 keys
// replayed from a bucket holding every cluster's. An op is a whole replay: Watch, every key,
// the end-of-replay marker, Stop.
//
// With a bucket of History 1 (MaxMsgsPerSubject 1) nats-server starts a deliver-last-per-subject
// consumer at the stream's first sequence and matches every stored subject against its filter,
// so a replay costs O(every cluster's keys); with History 2 it asks the subject index for the
// last sequence of each subject under the filter (MultiLastSeqs) and loads only those.
//
// go test -run '^$' -bench ReplayOneCluster -benchtime 200x ./kvfeed/
func BenchmarkReplayOneCluster(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		for _, history := range []uint8{1, 2} {
			b.Run(fmt.Sprintf("clusters=%d/history=%d", n, history), func(b *testing.B) {
				benchReplay(b, n, history)
			})
		}
	}
}

func benchReplay(b *testing.B, n int, history uint8) {
	const keysPerCluster = 10
	j := testkit.StartJetStream(b)
	ctx := testkit.Context(b, 10*time.Minute)
	if _, err := j.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: history, RePublish: subjects.FeedRePublish(bucket)}); err != nil {
		b.Fatal(err)
	}
	for c := range n {
		for k := range keysPerCluster {
			if _, err := j.JS.PublishAsync(fmt.Sprintf("$KV.%s.c%d.k%d", bucket, c, k), []byte("v")); err != nil {
				b.Fatal(err)
			}
		}
		if c%100 == 99 {
			<-j.JS.PublishAsyncComplete()
		}
	}
	<-j.JS.PublishAsyncComplete()
	b.ResetTimer()
	for i := range b.N {
		c := (i * 7919) % n // spread over the bucket, as reconnecting agents are
		w, err := kvfeed.Watch(ctx, j.JS, bucket, fmt.Sprintf("c%d.>", c), kvfeed.Options{})
		if err != nil {
			b.Fatal(err)
		}
		got := 0
		for e := range w.Updates() {
			if e == nil {
				break
			}
			got++
		}
		_ = w.Stop()
		if got != keysPerCluster {
			b.Fatalf("cluster c%d: replayed %d keys, want %d", c, got, keysPerCluster)
		}
	}
}
