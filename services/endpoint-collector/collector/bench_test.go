package collector

// Benchmarks for docs/benchmarks.md (## Endpoints). Each runs its scenario once per iteration
// and reports a figure and a ratio against a baseline measured in the same run, because these
// machines are shared and noisy:
//
//	go test -run '^$' -bench . -benchtime 1x ./collector/
import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// benchSlice builds a realistic report: eps endpoints with pod names, uids, zones and nodes.
// seq is encoded in the first endpoint's IP so that a reader can tell which update it sees.
func benchSlice(cluster string, svc, slice int, eps int, seq uint32) *endpointv1.EndpointSliceReport {
	r := &endpointv1.EndpointSliceReport{ClusterName: cluster, ClusterId: "id-" + cluster, Namespace: "bench",
		Service: fmt.Sprintf("svc-%d", svc), Slice: fmt.Sprintf("svc-%d-%s-%d", svc, cluster, slice), AddressType: "IPv4",
		SessionId: "bench-session", Generation: 1, Time: timestamppb.Now(),
		Ports: []*endpointv1.EndpointPort{{Name: "http", Port: 8080, Protocol: "TCP"}}}
	for i := range eps {
		ip := netip.AddrFrom4([4]byte{10, byte(svc >> 8), byte(svc), byte(i)})
		if i == 0 {
			ip = netip.AddrFrom4([4]byte{11, byte(seq >> 16), byte(seq >> 8), byte(seq)})
		}
		r.Endpoints = append(r.Endpoints, &endpointv1.Endpoint{Addresses: []string{ip.String()}, Ready: i%7 != 0 || seq%2 == 0,
			Serving: true, Zone: fmt.Sprintf("%s-zone-%d", cluster, i%3), Node: fmt.Sprintf("%s-node-%d", cluster, (svc+i)%100),
			Target: &endpointv1.TargetRef{Kind: "Pod", Namespace: "bench", Name: fmt.Sprintf("svc-%d-7d9f8b6c5-%05d", svc, i),
				Uid: uuid.NewString()}})
	}
	return r
}

func encodeReport(b testing.TB, r *endpointv1.EndpointSliceReport) []byte {
	env, err := events.NewEnvelope(context.Background(), r.ClusterName, r, "bench")
	if err != nil {
		b.Fatal(err)
	}
	data, err := proto.Marshal(env)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

func seqOf(sn *snapshot) (uint32, bool) {
	for ci := range sn.clusters {
		for si := range sn.clusters[ci].nslices() {
			if e := marker(sn.clusters[ci].slice(si)); e != nil {
				a := e.addr
				return uint32(a[13])<<16 | uint32(a[14])<<8 | uint32(a[15]), true
			}
		}
	}
	return 0, false
}

// responseSeq returns the seq a GetServiceEndpoints response carries: the lowest of its
// benchSlice markers (11.x.x.x), false if it has none.
func responseSeq(r *endpointv1.GetServiceEndpointsResponse) (uint32, bool) {
	var seq uint32
	found := false
	for _, c := range r.Clusters {
		for _, a := range c.Addresses {
			ip, err := netip.ParseAddr(a.Ip)
			if err != nil || !ip.Is4() || ip.As4()[0] != 11 {
				continue
			}
			b := ip.As4()
			if s := uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]); !found || s < seq {
				seq, found = s, true
			}
		}
	}
	return seq, found
}

// marker returns the endpoint of a benchSlice that carries its seq (11.x.x.x), nil if none.
func marker(s slice) *endpoint {
	for i := range s.n() {
		if e := s.ep(i); e.addr[12] == 11 {
			return &e
		}
	}
	return nil
}

func quietLogger() *zap.Logger { return zap.NewNop() }

// publishAll publishes msgs asynchronously with a bounded window, waits for every ack and
// returns the stream sequence of the last one.
func publishAll(b testing.TB, js jetstream.JetStream, msgs []*nats.Msg) uint64 {
	var last jetstream.PubAckFuture
	for _, m := range msgs {
		// A generous stall wait: on a loaded machine the default 200 ms fails the run when
		// the server falls behind, which says nothing about the collector.
		f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(30*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		last = f
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		b.Fatal("publish acks timed out")
	}
	select {
	case ack := <-last.Ok():
		return ack.Sequence
	case err := <-last.Err():
		b.Fatal(err)
	}
	return 0
}

// BenchmarkSliceUpdates: sustained EndpointSlice updates through agent-format reports on
// FLEET_AGENT until every one is applied and queryable, against the bus alone (as many
// messages published and consumed by a bare ordered consumer) in the same run, measured on a
// round before the collector starts and on another after it stops; the ratio is to their mean. 50,000 slices
// (5,000 services x 2 clusters x 5 slices x 10 endpoints) exist; each is then updated once.
// Every subject gets one update, so the stream never compacts one away: each report is
// decoded, merged and served.
//
// Timed: the first publish of the update round → the last service returned with all its
// updates by a real GetServiceEndpoints call (updates/s, ratio): as soon as a service's
// snapshot carries all ten of its updates, one of four queriers asks for it through the
// harness's Connect client over HTTP (filter ALL), again until the response carries them. Also reported:
// the first publish → the last such snapshot swapped into the store (swap-updates/s,
// swap-ratio), which is what this benchmark timed before it made a query.
func BenchmarkSliceUpdates(b *testing.B) {
	const (
		services = 5000
		perSvc   = 5
		eps      = 10
	)
	clusters := []string{"east", "west"}
	for range b.N {
		js := testkit.StartJetStream(b)
		_, pubJS := js.Connect(b)
		pubJS, _ = jetstream.New(pubJS.Conn(), jetstream.WithPublishAsyncMaxPending(4096))
		ctx := context.Background()
		if _, err := New(ctx, js.JS, Config{}, quietLogger()); err != nil { // topology
			b.Fatal(err)
		}
		round := func(seq uint32) []*nats.Msg {
			var msgs []*nats.Msg
			for s := range services {
				for _, cl := range clusters {
					for k := range perSvc {
						rep := benchSlice(cl, s, k, eps, seq)
						m := nats.NewMsg(subjects.AgentEndpointSlice(cl, "bench", rep.Slice))
						m.Data = encodeReport(b, rep)
						msgs = append(msgs, m)
					}
				}
			}
			return msgs
		}
		// The bus is measured before and after the collector (bus, ours, bus), each on a
		// round of its own, so neither side always runs first on a machine whose load drifts.
		initial, updates, again, after := round(1), round(2), round(3), round(4)
		n := len(updates)
		publishAll(b, pubJS, initial)
		bus := func(msgs []*nats.Msg) float64 {
			cons, err := js.JS.OrderedConsumer(ctx, subjects.AgentStreamName, jetstream.OrderedConsumerConfig{
				FilterSubjects: []string{"fleet.agent.*.endpointslice.>"}, DeliverPolicy: jetstream.DeliverNewPolicy})
			if err != nil {
				b.Fatal(err)
			}
			var got atomic.Int64
			done := make(chan struct{})
			cc, err := cons.Consume(func(m jetstream.Msg) {
				if got.Add(1) == int64(n) {
					close(done)
				}
			})
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Stop()
			start := time.Now()
			publishAll(b, pubJS, msgs)
			select {
			case <-done:
			case <-time.After(3 * time.Minute):
				b.Fatal("bus baseline did not finish")
			}
			return float64(n) / time.Since(start).Seconds()
		}
		busBefore := bus(updates)

		// The collector: it loads the 50,000 slices, then the second update round.
		h := startCollector(b, js.JS, Config{})
		var before dto.Metric
		_ = h.c.metrics.reports.Write(&before)
		var served, queried atomic.Int64
		var swapDone, queryDone atomic.Int64 // unix ns of the last service swapped in, queried
		complete := make(chan string, services)
		var finished sync.Map // services swapped in complete, each counted and queried once
		qctx, qcancel := context.WithCancel(ctx)
		var queriers sync.WaitGroup
		for range 4 {
			queriers.Go(func() {
				for {
					var name string
					select {
					case name = <-complete:
					case <-qctx.Done():
						return
					}
					for {
						resp, err := h.client.GetServiceEndpoints(qctx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{
							Namespace: "bench", Name: name, Filter: endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL}))
						if err != nil {
							if qctx.Err() == nil {
								b.Errorf("query %s: %v", name, err)
							}
							return
						}
						// All ten slices carry seq 3 when no older marker is left.
						if seq, ok := responseSeq(resp.Msg); ok && seq == 3 && len(resp.Msg.Clusters) == len(clusters) {
							break
						}
					}
					if queried.Add(1) == services {
						queryDone.Store(time.Now().UnixNano())
					}
				}
			})
		}
		h.c.onPublish = func(sn *snapshot) {
			// A service is done when all its slices carry seq 3.
			for ci := range sn.clusters {
				for si := range sn.clusters[ci].nslices() {
					if e := marker(sn.clusters[ci].slice(si)); e == nil || e.addr[15] != 3 {
						return
					}
				}
			}
			if len(sn.clusters) != len(clusters) {
				return
			}
			if _, again := finished.LoadOrStore(sn.key, true); !again {
				if served.Add(1) == services {
					swapDone.Store(time.Now().UnixNano())
				}
				complete <- sn.key[strings.IndexByte(sn.key, '/')+1:]
			}
		}
		// A CPU profile of the timed window alone (-test.cpuprofile also covers making the
		// reports and the bus rounds): FLEETSTREAM_BENCH_WINDOW_CPUPROFILE=<file>.
		if f := os.Getenv("FLEETSTREAM_BENCH_WINDOW_CPUPROFILE"); f != "" {
			pf, err := os.Create(f)
			if err != nil {
				b.Fatal(err)
			}
			defer pf.Close()
			if err := pprof.StartCPUProfile(pf); err != nil {
				b.Fatal(err)
			}
			defer pprof.StopCPUProfile()
		}
		start := time.Now()
		publishAll(b, pubJS, again)
		deadline := time.Now().Add(3 * time.Minute)
		for queried.Load() < services {
			if time.Now().After(deadline) {
				b.Fatalf("collector swapped in %d of %d services, queries returned %d", served.Load(), services, queried.Load())
			}
			time.Sleep(time.Millisecond)
		}
		pprof.StopCPUProfile()
		qcancel()
		queriers.Wait()
		rate := float64(n) / time.Duration(queryDone.Load()-start.UnixNano()).Seconds()
		swapRate := float64(n) / time.Duration(swapDone.Load()-start.UnixNano()).Seconds()
		// Every report was applied, none skipped (the counter is bumped just after a report
		// is handed to the reconciler, so it may trail the last snapshot by a moment).
		testkit.Eventually(b, time.Second, func() error {
			var after dto.Metric
			_ = h.c.metrics.reports.Write(&after)
			if applied := after.GetCounter().GetValue() - before.GetCounter().GetValue(); applied != float64(n) {
				return fmt.Errorf("applied %v of %d reports", applied, n)
			}
			return nil
		})
		h.stop()
		busAfter := bus(after)
		busRate := (busBefore + busAfter) / 2
		b.ReportMetric(rate, "updates/s")
		b.ReportMetric(busRate, "bus-updates/s")
		b.ReportMetric(busBefore, "bus-before/s")
		b.ReportMetric(busAfter, "bus-after/s")
		b.ReportMetric(rate/busRate, "ratio")
		b.ReportMetric(rate/50000, "vs-goal")
		b.ReportMetric(swapRate, "swap-updates/s")
		b.ReportMetric(swapRate/busRate, "swap-ratio")
	}
}

// BenchmarkSliceReplay: the collector's own ingest capacity, without a publisher competing for
// the two cores: 50,000 slice reports (500,000 endpoints) wait in FLEET_AGENT; the collector
// starts and applies every one until it is ready (all queryable), against a bare ordered
// consumer reading the same messages in the same run.
func BenchmarkSliceReplay(b *testing.B) {
	const (
		services = 5000
		perSvc   = 5
		eps      = 10
	)
	for range b.N {
		js := testkit.StartJetStream(b)
		_, pubJS := js.Connect(b)
		pubJS, _ = jetstream.New(pubJS.Conn(), jetstream.WithPublishAsyncMaxPending(4096))
		ctx := context.Background()
		if _, err := New(ctx, js.JS, Config{}, quietLogger()); err != nil { // topology
			b.Fatal(err)
		}
		var msgs []*nats.Msg
		for s := range services {
			for _, cl := range []string{"east", "west"} {
				for k := range perSvc {
					rep := benchSlice(cl, s, k, eps, 1)
					m := nats.NewMsg(subjects.AgentEndpointSlice(cl, "bench", rep.Slice))
					m.Data = encodeReport(b, rep)
					msgs = append(msgs, m)
				}
			}
		}
		n := len(msgs)
		publishAll(b, pubJS, msgs)

		cons, err := js.JS.OrderedConsumer(ctx, subjects.AgentStreamName, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"fleet.agent.*.endpointslice.>"}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy})
		if err != nil {
			b.Fatal(err)
		}
		var got atomic.Int64
		done := make(chan struct{})
		start := time.Now()
		cc, err := cons.Consume(func(m jetstream.Msg) {
			if got.Add(1) == int64(n) {
				close(done)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		<-done
		busRate := float64(n) / time.Since(start).Seconds()
		cc.Stop()

		// The collector as it runs, then the same with every report decoded by the generated
		// code (proto.Unmarshal of the envelope and the report, then convert): the
		// hand-written wire decoder stays only while it is worth more than 20% of this.
		replay := func(prep func(*Collector)) float64 {
			start := time.Now()
			h := startCollectorWith(b, js.JS, Config{}, prep)
			rate := float64(n) / time.Since(start).Seconds()
			if got := len(h.c.store.Services(nil)); got != services {
				b.Fatalf("%d services", got)
			}
			h.stop()
			return rate
		}
		rate := replay(nil)
		genRate := replay(func(c *Collector) {
			c.ingest.fast = func([]byte, string) (reportHeader, *slice, error) { return reportHeader{}, nil, errSlowPath }
		})
		b.ReportMetric(rate, "updates/s")
		b.ReportMetric(busRate, "bus-updates/s")
		b.ReportMetric(rate/busRate, "ratio")
		b.ReportMetric(rate/50000, "vs-goal")
		b.ReportMetric(genRate, "generated-updates/s")
		b.ReportMetric(genRate/rate, "generated/wire")
	}
}

// BenchmarkReportToQueryLatency: at 5,000 slice updates/s (20,000 updates of 1,000 services),
// how long from the agent's publish until a GetServiceEndpoints call returns the update, p50 and
// p99 (query-p50-ms, query-p99-ms), against the bus alone (publish until a bare ordered
// consumer receives it) at the same rate in the same run. The call is a real one, through the
// harness's Connect client over HTTP, issued as soon as the snapshot carrying the update is
// swapped into the store (the collector's onPublish hook tells one of four queriers which
// service to ask; filter ALL, as the marker endpoint is not ready in every update), so the
// figure is publish → swap → a response that carries the update
// received and decoded, without a poller's interval; a response without it is asked again.
// Also reported: publish → the swap alone (swap-p50-ms, swap-p99-ms), the figure this
// benchmark reported as "report → query" before it made a query. Updates the work queue
// coalesced count from the later update that superseded them.
func BenchmarkReportToQueryLatency(b *testing.B) {
	const (
		rate     = 5000
		seconds  = 4
		services = 1000
		eps      = 10
	)
	total := rate * seconds
	for range b.N {
		js := testkit.StartJetStream(b)
		_, pubJS := js.Connect(b)
		ctx := context.Background()
		if _, err := New(ctx, js.JS, Config{}, quietLogger()); err != nil { // topology
			b.Fatal(err)
		}
		// Pre-encode: report i updates service i%services with seq i.
		msgs := make([]*nats.Msg, total)
		for i := range msgs {
			rep := benchSlice("east", i%services, 0, eps, uint32(i))
			msgs[i] = nats.NewMsg(subjects.AgentEndpointSlice("east", "bench", rep.Slice))
			msgs[i].Data = encodeReport(b, rep)
		}
		sentAt := make([]atomic.Int64, total)
		lat := make([]time.Duration, total)
		var seen atomic.Int64

		pace := func() {
			// 5 messages every millisecond, publish time recorded per message.
			t := time.NewTicker(time.Millisecond)
			defer t.Stop()
			per := rate / 1000
			for i := 0; i < total; i += per {
				<-t.C
				for j := i; j < min(i+per, total); j++ {
					sentAt[j].Store(time.Now().UnixNano())
					if _, err := pubJS.PublishMsgAsync(msgs[j]); err != nil {
						b.Error(err)
						return
					}
				}
			}
			<-pubJS.PublishAsyncComplete()
		}
		// Until everything is seen, or nothing more comes (the bus may skip a superseded one).
		wait := func() {
			last, idle := seen.Load(), 0
			for seen.Load() < int64(total) && idle < 100 {
				time.Sleep(5 * time.Millisecond)
				if n := seen.Load(); n == last {
					idle++
				} else {
					last, idle = n, 0
				}
			}
		}

		// Baseline: the bus alone.
		cons, err := js.JS.OrderedConsumer(ctx, subjects.AgentStreamName, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"fleet.agent.*.endpointslice.>"}, DeliverPolicy: jetstream.DeliverNewPolicy})
		if err != nil {
			b.Fatal(err)
		}
		idx := map[string][]int{}
		for i, m := range msgs {
			idx[m.Subject] = append(idx[m.Subject], i)
		}
		var bmu sync.Mutex
		next := map[string]int{}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			now := time.Now().UnixNano()
			bmu.Lock()
			k := next[m.Subject()]
			next[m.Subject()] = k + 1
			i := idx[m.Subject()][k]
			bmu.Unlock()
			lat[i] = time.Duration(now - sentAt[i].Load())
			seen.Add(1)
		})
		if err != nil {
			b.Fatal(err)
		}
		pace()
		wait()
		cc.Stop()
		busP50, busP99 := percentiles(lat[:seen.Load()])

		// The collector (started now, so it did not compete with the baseline): latency until
		// the snapshot carrying each update is swapped in, and until a GetServiceEndpoints
		// call returns it. Updates the work queue coalesced are served by the snapshot of a
		// later one of the same service: they count from then.
		h := startCollector(b, js.JS, Config{})
		for i := range lat {
			lat[i] = 0
			sentAt[i].Store(0)
		}
		seen.Store(0)
		qlat := make([]time.Duration, total)
		var queried atomic.Int64
		type ask struct {
			svc     int
			seq     uint32
			updates []int // the updates this snapshot is the first to carry
		}
		asks := make(chan ask, total)
		qctx, qcancel := context.WithCancel(ctx)
		var queriers sync.WaitGroup
		for range 4 {
			queriers.Go(func() {
				for {
					var a ask
					select {
					case a = <-asks:
					case <-qctx.Done():
						return
					}
					for {
						resp, err := h.client.GetServiceEndpoints(qctx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{
							Namespace: "bench", Name: fmt.Sprintf("svc-%d", a.svc), Filter: endpointv1.EndpointFilter_ENDPOINT_FILTER_ALL}))
						if err != nil {
							if qctx.Err() == nil {
								b.Errorf("query svc-%d: %v", a.svc, err)
							}
							return
						}
						if seq, ok := responseSeq(resp.Msg); !ok || seq < a.seq {
							continue // not yet visible to a query: ask again
						}
						now := time.Now().UnixNano()
						for _, i := range a.updates {
							qlat[i] = time.Duration(now - sentAt[i].Load())
						}
						queried.Add(int64(len(a.updates)))
						break
					}
				}
			})
		}
		nextSeq := make([]int, services) // per service, the next seq not yet served
		for k := range nextSeq {
			nextSeq[k] = k
		}
		h.c.onPublish = func(sn *snapshot) {
			s, ok := seqOf(sn)
			if !ok || int(s) >= total {
				return
			}
			now := time.Now().UnixNano()
			k := int(s) % services
			var covered []int
			for i := nextSeq[k]; i <= int(s); i += services {
				if t := sentAt[i].Load(); t != 0 {
					lat[i] = time.Duration(now - t)
					seen.Add(1)
					covered = append(covered, i)
				}
				nextSeq[k] = i + services
			}
			if len(covered) > 0 {
				asks <- ask{svc: k, seq: s, updates: covered}
			}
		}
		pace()
		wait()
		deadline := time.Now().Add(time.Minute)
		for queried.Load() < seen.Load() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		qcancel()
		queriers.Wait()
		collect := func(lat []time.Duration) []time.Duration {
			var got []time.Duration
			for _, d := range lat {
				if d > 0 {
					got = append(got, d)
				}
			}
			return got
		}
		got, gotQ := collect(lat), collect(qlat)
		p50, p99 := percentiles(got)
		qp50, qp99 := percentiles(gotQ)
		b.ReportMetric(float64(qp50.Microseconds())/1000, "query-p50-ms")
		b.ReportMetric(float64(qp99.Microseconds())/1000, "query-p99-ms")
		b.ReportMetric(float64(p50.Microseconds())/1000, "swap-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "swap-p99-ms")
		b.ReportMetric(float64(busP50.Microseconds())/1000, "bus-p50-ms")
		b.ReportMetric(float64(busP99.Microseconds())/1000, "bus-p99-ms")
		b.ReportMetric(float64(len(gotQ)), "queried-samples")
		if len(got) != total || len(gotQ) != total {
			b.Fatalf("%d of %d updates swapped in, %d returned by a query", len(got), total, len(gotQ))
		}
		if busP99 > 0 {
			b.ReportMetric(float64(qp99)/float64(busP99), "query-p99-ratio")
		}
		h.stop()
	}
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)*99/100]
}

// BenchmarkMemoryPerEndpoint: heap held by the collector for 50,000 services x 2 clusters x
// eps endpoints (one slice each, as agents report them; eps 1, 3 and 10, the last 1,000,000
// endpoints), against the same endpoints held as the API's own messages (a map of service to
// []*ClusterEndpoints, the straightforward design) in the same run; and, at 1 and 3 endpoints
// per slice, for as many services as make the 1,000,000 endpoints the architecture plans for
// (1m-eps-1: 500,000 services; 1m-eps-3: 166,667).
//
// The collector runs as deployed by default: its writer of bucket `endpoints` is on and has
// written every service (through memAcker, which acks each publish at once, so the heap is the
// collector's and not an embedded NATS server's). Two figures: after every report is applied
// and written ("bytes/endpoint"), and after every service has then been queried once through
// GetServiceEndpoints with the response encoded by the API's JSON codec, which caches the
// response and its encoding in the snapshot within the response cache's budget (by default
// scaled with the store: 64 bytes an address, 4 to 32 MiB) ("queried-bytes/endpoint", the one
// the goal of ≤ 250 bytes is judged on).
//
//	go test -run '^$' -bench MemoryPerEndpoint -benchtime 1x -count 2 ./collector/
func BenchmarkMemoryPerEndpoint(b *testing.B) {
	for _, tc := range []struct {
		name          string
		eps, services int
		owned         bool
	}{
		{"eps-1", 1, 50000, false}, {"eps-3", 3, 50000, false}, {"eps-10", 10, 50000, false},
		{"1m-eps-1", 1, 500000, false}, {"1m-eps-3", 3, 166667, false},
		// Namespace bench owned by one project on both clusters: each service is then its
		// whole state plus that project's view (ownership.go), queried as the project's.
		{"owned-eps-1", 1, 50000, true}, {"owned-eps-10", 10, 50000, true},
	} {
		b.Run(tc.name, func(b *testing.B) { benchmarkMemoryPerEndpoint(b, tc.eps, tc.services, tc.owned) })
	}
}

// staticOwnership is namespace bindings that never change: namespace → its bindings.
type staticOwnership map[string]owning

func (s staticOwnership) NamespaceBindings(ns string) []*projectv1.NamespaceBinding { return s[ns] }
func (staticOwnership) NamespaceBindingsChanged() <-chan struct{}                   { return nil }
func (staticOwnership) Ready() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

func benchmarkMemoryPerEndpoint(b *testing.B, eps, services int, owned bool) {
	clusters := []string{"east", "west"}
	total := services * len(clusters) * eps
	for range b.N {
		ctx, cancel := context.WithCancel(context.Background())
		before := liveHeap()
		// 50,000 slices per cluster: over the default per-cluster limit, which would refuse half.
		c := newCollector(Config{Limits: Limits{MaxEndpointSlicesPerCluster: 1 << 30, MaxEndpointsPerCluster: 1 << 30}}, quietLogger())
		if owned {
			var o owning
			for _, cl := range clusters {
				o = append(o, &projectv1.NamespaceBinding{Project: "p", Cluster: cl, Namespace: "bench"})
			}
			c.UseOwnership(staticOwnership{"bench": o})
		}
		acker := &memAcker{}
		c.js = acker
		c.kv = &kvWriter{c: c, dirty: map[string]struct{}{}}
		writerDone := make(chan struct{})
		go func() { defer close(writerDone); _ = c.kv.run(ctx) }()
		for !c.kv.active.Load() {
			time.Sleep(time.Millisecond)
		}
		now := time.Now()
		for s := range services {
			for _, cl := range clusters {
				rep := benchSlice(cl, s, 0, eps, 0)
				data := encodeReport(b, rep)
				if err := c.ingest.handle(subjects.AgentEndpointSlice(cl, "bench", rep.Slice), data, now); err != nil {
					b.Fatal(err)
				}
			}
			// Reconcile as the workers would (synchronously here).
			for c.queue.Len() > 0 {
				key, _ := c.queue.Get()
				c.reconcile(key)
				c.queue.Done(key)
			}
		}
		if n := len(c.store.Services(nil)); n != services {
			b.Fatalf("%d services", n)
		}
		// Every service written to the bucket, the writer idle between flushes.
		deadline := time.Now().Add(5 * time.Minute)
		for {
			c.kv.mu.Lock()
			dirty := len(c.kv.dirty)
			c.kv.mu.Unlock()
			if dirty == 0 && acker.published.Load() >= int64(services) {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("writer: %d dirty, %d published", dirty, acker.published.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(2 * c.cfg.ViewFlushInterval) // the last flush's acks are collected
		written := liveHeap()
		writeHeapProfile(b, fmt.Sprintf("written-eps-%d-services-%d", eps, services))

		// Every service queried once, as a Connect JSON client would.
		close(c.ready)
		codec := &jsonCodec{r: c.codec}
		for s := range services {
			var msg *endpointv1.GetServiceEndpointsResponse
			if owned {
				// The project's view, as its owner's GetServiceEndpoints reads it (viewOf).
				msg = c.store.snapshot(projectKey(serviceKey("bench", fmt.Sprintf("svc-%d", s)), "p")).response(c.env, 0, "")
			} else {
				resp, err := c.GetServiceEndpoints(ctx, connect.NewRequest(&endpointv1.GetServiceEndpointsRequest{Namespace: "bench", Name: fmt.Sprintf("svc-%d", s)}))
				if err != nil {
					b.Fatal(err)
				}
				msg = resp.Msg
			}
			if _, err := codec.Marshal(msg); err != nil {
				b.Fatal(err)
			}
		}
		queried := liveHeap()
		writeHeapProfile(b, fmt.Sprintf("queried-eps-%d-services-%d", eps, services))
		cachedEntries, cachedBytes := c.codec.stats()
		ours := float64(written-before) / float64(total)
		oursQueried := float64(queried-before) / float64(total)
		runtime.KeepAlive(c)
		cancel()
		<-writerDone

		// Baseline: the same endpoints as API messages.
		naive := map[string][]*endpointv1.ClusterEndpoints{}
		before = liveHeap()
		for s := range services {
			var ces []*endpointv1.ClusterEndpoints
			for _, cl := range clusters {
				rep := benchSlice(cl, s, 0, eps, 0)
				ce := &endpointv1.ClusterEndpoints{ClusterId: rep.ClusterId, ClusterName: cl, Weight: 100}
				for _, e := range rep.Endpoints {
					ce.Addresses = append(ce.Addresses, &endpointv1.Address{Ip: e.Addresses[0], Port: 8080, Weight: 100,
						Ready: e.Ready, Serving: e.Serving, Zone: e.Zone, Node: e.Node, PortName: "http", Protocol: "TCP",
						EndpointWeight: 100, Target: "Pod/" + e.Target.Name})
				}
				ces = append(ces, ce)
			}
			naive["bench/"+fmt.Sprintf("svc-%d", s)] = ces
		}
		after := liveHeap()
		base := float64(after-before) / float64(total)
		runtime.KeepAlive(naive)
		b.ReportMetric(ours, "bytes/endpoint")
		b.ReportMetric(oursQueried, "queried-bytes/endpoint")
		b.ReportMetric(base, "naive-bytes/endpoint")
		b.ReportMetric(oursQueried/base, "ratio")
		b.ReportMetric(oursQueried/250, "vs-goal")
		b.ReportMetric(float64(cachedEntries), "cached-responses")
		b.Logf("%d endpoints per slice, %d endpoints: written %.0f B/endpoint, queried %.0f B/endpoint, naive %.0f B/endpoint; %d bucket writes; %d responses cached, %.1f MiB estimated",
			eps, total, ours, oursQueried, base, acker.published.Load(), cachedEntries, float64(cachedBytes)/(1<<20))
	}
}

// writeHeapProfile writes the live heap to $BENCH_HEAPPROFILE_DIR/<name>.pprof when that is
// set: -memprofile is written after the benchmark, when the collector is garbage, so it cannot
// say where the measured bytes are (go tool pprof -sample_index=inuse_space).
func writeHeapProfile(b *testing.B, name string) {
	dir := os.Getenv("BENCH_HEAPPROFILE_DIR")
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

// memAcker stands in for JetStream under the collector's bucket writer: it acks every publish
// at once and keeps nothing, so a memory benchmark counts the collector's heap only.
type memAcker struct {
	jetstream.JetStream // anything else panics: the benchmark drives only the writer
	published           atomic.Int64
}

func (m *memAcker) PublishMsgAsync(msg *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	m.published.Add(1)
	return ackedFuture{msg: msg}, nil
}

func (m *memAcker) KeyValue(context.Context, string) (jetstream.KeyValue, error) {
	return nil, jetstream.ErrBucketNotFound
}

var closedAck = func() chan *jetstream.PubAck {
	ch := make(chan *jetstream.PubAck, 1)
	ch <- &jetstream.PubAck{}
	close(ch)
	return ch
}()

type ackedFuture struct{ msg *nats.Msg }

func (f ackedFuture) Ok() <-chan *jetstream.PubAck { return closedAck }
func (ackedFuture) Err() <-chan error              { return nil }
func (f ackedFuture) Msg() *nats.Msg               { return nil }

// BenchmarkResponseCacheHitRate: what a response cache budget buys. 50,000 services x 2
// clusters x eps endpoints (as BenchmarkMemoryPerEndpoint); 200,000 GetServiceEndpoints
// (encoded as a Connect JSON client asks) warm the cache, then 200,000 more are counted: the
// share answered from the cache (hit-rate), their mean time (a miss builds and encodes the
// response), and the heap the cache then holds per endpoint of the store. Services are drawn
// Zipf-distributed (a few are polled by many proxies, most rarely; s is the exponent) or
// uniformly. Budget 0 is the default, which scales with the store.
//
//	go test -run '^$' -bench 'ResponseCacheHitRate/eps-1/' -benchtime 1x ./collector/
func BenchmarkResponseCacheHitRate(b *testing.B) {
	const (
		services = 50000
		queries  = 200000
	)
	for _, eps := range []int{1, 3, 10} {
		for _, mib := range []int64{0, 2, 4, 8, 16, 32} {
			for _, dist := range []string{"zipf-1.1", "zipf-1.5", "uniform"} {
				b.Run(fmt.Sprintf("eps-%d/%dMiB/%s", eps, mib, dist), func(b *testing.B) {
					for range b.N {
						c := memCollector(b, Config{ResponseCacheBytes: mib << 20}, services, eps)
						before := liveHeap()
						rng := rand.New(rand.NewPCG(1, 2))
						next := func() int { return rng.IntN(services) }
						if s, ok := strings.CutPrefix(dist, "zipf-"); ok {
							exp, _ := strconv.ParseFloat(s, 64)
							z := rand.NewZipf(rng, exp, 1, services-1)
							perm := rng.Perm(services) // the popular services are not the first ones
							next = func() int { return perm[z.Uint64()] }
						}
						for range queries {
							query(b, c, next())
						}
						picks := make([]int, queries)
						for i := range picks {
							picks[i] = next()
						}
						hits := 0
						start := time.Now()
						for _, s := range picks {
							if c.store.snapshot(fmt.Sprintf("bench/svc-%d", s)).cached(endpointv1.EndpointFilter_ENDPOINT_FILTER_READY) != nil {
								hits++
							}
							query(b, c, s)
						}
						elapsed := time.Since(start)
						after := liveHeap()
						entries, _ := c.codec.stats()
						b.ReportMetric(float64(hits)/queries, "hit-rate")
						b.ReportMetric(float64(elapsed.Nanoseconds())/queries, "ns/query")
						b.ReportMetric(float64(entries), "cached-responses")
						b.ReportMetric(float64(c.codec.limit())/(1<<20), "budget-MiB")
						b.ReportMetric((float64(after)-float64(before))/float64(services*2*eps), "cache-bytes/endpoint")
						runtime.KeepAlive(c)
					}
				})
			}
		}
	}
}

// BenchmarkResponseMiss: what a response cache miss costs against a hit, in process (no HTTP):
// building a service's response from its snapshot and encoding it as JSON, against copying the
// cached encoding of the cached response. 2 clusters x eps endpoints.
//
//	go test -run '^$' -bench ResponseMiss -benchtime 1s -count 2 ./collector/
func BenchmarkResponseMiss(b *testing.B) {
	for _, eps := range []int{1, 3, 10} {
		c := memCollector(b, Config{}, 1, eps)
		sn := c.store.snapshot("bench/svc-0")
		codec := &jsonCodec{r: c.codec}
		b.Run(fmt.Sprintf("eps-%d/miss", eps), func(b *testing.B) {
			for range b.N {
				if _, err := codec.MarshalAppend(nil, sn.build(c.store.strs, endpointv1.EndpointFilter_ENDPOINT_FILTER_READY, "")); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("eps-%d/hit", eps), func(b *testing.B) {
			for range b.N {
				if _, err := codec.MarshalAppend(nil, sn.response(c.env, endpointv1.EndpointFilter_ENDPOINT_FILTER_READY, "")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkIngestApply: the collector's own work per agent report, in process, without NATS
// (whose share swamps the collector's in the benchmarks above on a shared machine): decode,
// apply and reconcile, the snapshot published. 5,000 services x 2 clusters, one slice each of
// eps endpoints; "new" applies them to an empty collector (a replay), "update" applies other
// contents for the same slices.
//
//	go test -run '^$' -bench IngestApply -benchtime 5x -count 3 ./collector/
func BenchmarkIngestApply(b *testing.B) {
	const services = 5000
	for _, eps := range []int{1, 10} {
		var msgs [2][]*nats.Msg
		for seq := range 2 {
			for s := range services {
				for _, cl := range []string{"east", "west"} {
					rep := benchSlice(cl, s, 0, eps, uint32(seq))
					m := nats.NewMsg(subjects.AgentEndpointSlice(cl, "bench", rep.Slice))
					m.Data = encodeReport(b, rep)
					msgs[seq] = append(msgs[seq], m)
				}
			}
		}
		apply := func(c *Collector, ms []*nats.Msg) {
			now := time.Now()
			for i, m := range ms {
				if err := c.ingest.handle(m.Subject, m.Data, now); err != nil {
					b.Fatal(err)
				}
				if i%2 == 1 { // both clusters of a service, then its reconcile
					for c.queue.Len() > 0 {
						key, _ := c.queue.Get()
						c.reconcile(key)
						c.queue.Done(key)
					}
				}
			}
		}
		b.Run(fmt.Sprintf("eps-%d/new", eps), func(b *testing.B) {
			var d time.Duration
			for range b.N {
				c := newCollector(Config{}, quietLogger())
				start := time.Now()
				apply(c, msgs[0])
				d += time.Since(start)
			}
			b.ReportMetric(float64(d.Nanoseconds())/float64(b.N*len(msgs[0])), "ns/report")
		})
		b.Run(fmt.Sprintf("eps-%d/update", eps), func(b *testing.B) {
			c := newCollector(Config{}, quietLogger())
			apply(c, msgs[0])
			var d time.Duration
			for i := range b.N {
				start := time.Now()
				apply(c, msgs[(i+1)%2])
				d += time.Since(start)
			}
			b.ReportMetric(float64(d.Nanoseconds())/float64(b.N*len(msgs[0])), "ns/report")
		})
	}
}
