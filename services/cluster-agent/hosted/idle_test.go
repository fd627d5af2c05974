package hosted

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// BenchmarkIdleFleet runs the whole supervisor (its caches fed by a real JetStream) over N
// registered clusters, none hosted, while every cluster heartbeats once per round of 5 s (the
// agents' default interval), spread over the round: the cost the issue measured in fleetd
// ("Idle costs N²"). Each op is one round; without-supervisor is the same rounds with no
// supervisor, so the difference is the supervisor's share of a core. Only supervise, New and the buckets are
// used, so the file runs unchanged against the code before issue 26.
//
//	go test -run '^$' -bench IdleFleet -benchtime 2x ./hosted/
func BenchmarkIdleFleet(b *testing.B) {
	for _, n := range []int{1000, 2000} {
		var base float64
		for _, mode := range []string{"without-supervisor", "supervisor"} {
			b.Run(fmt.Sprintf("clusters=%d/%s", n, mode), func(b *testing.B) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				js := testkit.StartJetStream(b).JS
				clustersKV, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.ClustersBucket})
				if err != nil {
					b.Fatal(err)
				}
				statusKV, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.ClusterStatusBucket})
				if err != nil {
					b.Fatal(err)
				}
				put := func(kv jetstream.KeyValue, name string, m proto.Message) {
					data, err := proto.Marshal(m)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := kv.Put(ctx, keys.Encode(name), data); err != nil {
						b.Fatal(err)
					}
				}
				heartbeat := func(name string, own bool) {
					st := &clusterv1.AgentStatus{ClusterName: name, SessionId: "s", LastSeen: timestamppb.Now()}
					if own {
						st.InClusterLastSeen = st.LastSeen
					}
					put(statusKV, name, st)
				}
				names := make([]string, n)
				for i := range n {
					names[i] = fmt.Sprintf("cluster-%05d", i)
					st := &clusterv1.ClusterStatus{}
					if i%2 == 1 {
						st.CredentialsSet, st.CredentialsFingerprint = true, "fp"
					}
					put(clustersKV, names[i], &clusterv1.Cluster{Id: names[i], Name: names[i], Status: st})
					heartbeat(names[i], true)
				}
				if mode == "supervisor" {
					s, err := New(Config{NATSURL: "nats://127.0.0.1:1", ServiceToken: "unused"}, js, zap.NewNop())
					if err != nil {
						b.Fatal(err)
					}
					done := make(chan error, 1)
					go func() { done <- s.supervise(ctx) }()
					defer func() {
						cancel()
						<-done
						if got := s.Hosting(); len(got) != 0 {
							b.Errorf("hosting %d clusters", len(got))
						}
					}()
				}
				time.Sleep(time.Second) // the caches load
				round := 5 * time.Second
				b.ResetTimer()
				start := idleCPU()
				for b.Loop() {
					end := time.Now().Add(round)
					for i, name := range names {
						heartbeat(name, true)
						if d := time.Until(end.Add(-round * time.Duration(n-i-1) / time.Duration(n))); d > 0 {
							time.Sleep(d)
						}
					}
				}
				cpu := float64(idleCPU()-start) / float64(time.Duration(b.N)*round) * 100
				b.ReportMetric(cpu, "%core")
				if mode == "without-supervisor" {
					base = cpu
				} else {
					b.ReportMetric(cpu-base, "%core-supervisor")
				}
			})
		}
	}
}

func idleCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
