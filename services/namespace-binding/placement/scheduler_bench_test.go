package placement

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
)

// BenchmarkSchedulerJoin: 1,000 (5,000) clusters join at once (registry puts back to back, as an
// import does) under 20 placements that each pick every cluster; timed from the first put until
// every placement has decided all of them. The scheduler's part of a fleet joining: it is
// woken by every join, and must neither re-decide every placement per join nor leave a
// placement undecided for long. Reported: join-ms (wall), cpu-ms (the process's: hub, NATS
// server and the puts), and decision-events per placement (how many times each was re-decided
// on the way; the fewer, the more the joins were gathered).
//
//	cd services/namespace-binding && go test -run '^$' -bench SchedulerJoin/clusters=1000 -benchtime 3x -count 5 ./placement/
func BenchmarkSchedulerJoin(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) { benchmarkSchedulerJoin(b, n) })
	}
}

func benchmarkSchedulerJoin(b *testing.B, clusters int) {
	const placements = 20
	var wall, cpu time.Duration
	var events float64
	for range b.N {
		b.StopTimer()
		h := startTestHub(b, nil)
		h.bindSet(b, "team", "global")
		for i := range placements {
			h.createPlacement(b, &placementv1.Placement{Project: "team", Name: fmt.Sprintf("p%d", i)})
		}
		if err := h.svc.WaitSchedulingRound(context.Background()); err != nil {
			b.Fatal(err)
		}
		before, err := decisionEvents(h)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start, startCPU := time.Now(), processCPU(b)
		for i := range clusters {
			h.putCluster(b, clusterName(i), map[string]string{"zone": fmt.Sprint(i % 3)})
		}
		for i := range placements {
			h.waitDecided(b, "team", fmt.Sprintf("p%d", i), clusters, 2*time.Minute)
		}
		wall += time.Since(start)
		cpu += processCPU(b) - startCPU
		b.StopTimer()
		after, err := decisionEvents(h)
		if err != nil {
			b.Fatal(err)
		}
		events += float64(after-before) / placements
	}
	n := float64(b.N)
	b.ReportMetric(float64(wall.Milliseconds())/n, "join-ms")
	b.ReportMetric(float64(cpu.Milliseconds())/n, "cpu-ms")
	b.ReportMetric(events/n, "decision-events/placement")
}

// decisionEvents counts the decision events in the stream.
func decisionEvents(h *testHub) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := h.svc.stream.Info(ctx, jetstream.WithSubjectFilter(SubjectPrefix+".decision.>"))
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
