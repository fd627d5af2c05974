package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/protobuf/types/known/timestamppb"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	"github.com/fleetstream/fleetstream/pkg/server"
)

// BenchmarkProcessLatency: the latency the gateway process adds to a Connect unary call
// (GetServiceEndpoints, JSON), against what haproxy adds on the same path to the same backend.
//
// One client with one keep-alive HTTP/1.1 connection per side calls, in the same run:
// "direct", the backend itself; "haproxy", haproxy in front of it (its own process: mode http,
// keep-alive on both sides, http-reuse always, no logging); "gateway", cmd/gateway of this tree
// built and run as its own process, as deployed (token authentication, request id, access log
// to /dev/null, metrics). Calls go in blocks of 10 per side, and the side that starts a round
// rotates, so no side always follows the same other one.
//
// The backend is pkg/server (the services' own HTTP server, interceptors and token
// authentication) serving the real generated EndpointService handler, whose
// GetServiceEndpoints answers a fixed 20-cluster reply from memory: the path and the HTTP stack
// of a real call, without fleetd's JetStream and views, so that what is measured is the proxies
// and not the store. It runs in the benchmark's process, like the client: the same for every
// side.
//
// Added latency is a side's quantile minus direct's same quantile; the figure to read is
// added-gateway/haproxy at p50 and p99 (issue 29: ≤ 1.2). Without haproxy the benchmark is
// skipped, saying so; `make bench-gateway` installs it first where it can.
//
// FLEETSTREAM_BENCH_GATEWAY_CPUPROFILE=file builds the gateway with the gatewayprofile tag and
// writes the gateway process's CPU profile of the timed calls to file;
// FLEETSTREAM_BENCH_GATEWAY_ENV="K=V ..." adds to the gateway process's environment
// (GOMAXPROCS=1, GODEBUG=..., for experiments); FLEETSTREAM_BENCH_GATEWAYS="name=/path/to/gateway
// ..." adds other gateway binaries as further sides of the same run (gateway-name).
func BenchmarkProcessLatency(b *testing.B) {
	const (
		samples = 3000 // per side: p99 is the 30th slowest
		block   = 10
		proc    = "/fleetstream.endpoint.v1.EndpointService/GetServiceEndpoints"
		token   = "tok-bench-0123456789"
	)
	haproxy, err := haproxyBinary()
	if err != nil {
		b.Skipf("no haproxy baseline, so nothing to compare with: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := b.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(token+",admin\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	backend := startBenchBackend(ctx, b, tokens)

	profile := os.Getenv("FLEETSTREAM_BENCH_GATEWAY_CPUPROFILE")
	bin := filepath.Join(dir, "gateway")
	build := exec.Command("go", "build", "-o", bin)
	if profile != "" {
		build.Args = append(build.Args, "-tags", "gatewayprofile")
	}
	build.Args = append(build.Args, "github.com/fleetstream/fleetstream/services/gateway/cmd/gateway")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build cmd/gateway: %v: %s", err, out)
	}
	gwAddr, gwProc := startGatewayProc(b, bin, backend, tokens, profile)
	hpAddr, hpProc := startHAProxyProc(b, haproxy, backend, dir)

	type side struct {
		name, url string
		pid       int // the proxy's process; 0 for direct
		lat       []time.Duration
	}
	sides := []*side{
		{name: "direct", url: "http://" + backend + proc},
		{name: "haproxy", url: "http://" + hpAddr + proc, pid: hpProc.Pid},
		{name: "gateway", url: "http://" + gwAddr + proc, pid: gwProc.Pid},
	}
	// Other gateway binaries (another commit's, say) as further sides of the same run: a
	// change is only measurable against its predecessor interleaved with it, as runs on this
	// machine differ more than most changes do.
	for _, nb := range strings.Fields(os.Getenv("FLEETSTREAM_BENCH_GATEWAYS")) {
		name, other, ok := strings.Cut(nb, "=")
		if !ok {
			b.Fatalf("FLEETSTREAM_BENCH_GATEWAYS: %q: want name=/path/to/gateway", nb)
		}
		addr, p := startGatewayProc(b, other, backend, tokens, "")
		sides = append(sides, &side{name: "gateway-" + name, url: "http://" + addr + proc, pid: p.Pid})
	}
	// One idle connection per side, kept alive; no Accept-Encoding, so that the backend never
	// spends time compressing (the answer is below connect's 1 KiB threshold anyway).
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}}
	body := []byte(`{"namespace":"bench","name":"cart"}`)
	call := func(url string) (time.Duration, error) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		start := time.Now()
		res, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		got, err := io.ReadAll(res.Body)
		res.Body.Close()
		d := time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("%s: read answer: %w", url, err)
		}
		if res.StatusCode != http.StatusOK || !strings.Contains(string(got), `"cluster-19"`) {
			return 0, fmt.Errorf("%s: HTTP %d: %s", url, res.StatusCode, got)
		}
		return d, nil
	}
	// Warm every side up (connections, the gateway's upstream health) before timing.
	for _, s := range sides {
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := call(s.url)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s never answered: %v", s.name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		for range 200 {
			if _, err := call(s.url); err != nil {
				b.Fatal(err)
			}
		}
	}
	if profile != "" {
		_ = os.Remove(profile) // a previous run's (b.N=1 runs first) is not this one's
		if err := gwProc.Signal(syscall.SIGUSR1); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		cpu0 := map[string]time.Duration{}
		for _, s := range sides {
			s.lat = s.lat[:0]
			if s.pid != 0 {
				cpu0[s.name] = processCPU(s.pid)
			}
		}
		for round := 0; len(sides[0].lat) < samples; round++ {
			for i := range sides {
				s := sides[(round+i)%len(sides)]
				for range block {
					d, err := call(s.url)
					if err != nil {
						b.Fatal(err)
					}
					s.lat = append(s.lat, d)
				}
			}
		}
		// CPU time (user and system) each proxy process spent per call it proxied: what its
		// latency costs in work, as opposed to waiting.
		for _, s := range sides {
			if c, ok := cpu0[s.name]; ok && c >= 0 {
				b.ReportMetric(float64(processCPU(s.pid)-c)/float64(time.Microsecond)/float64(len(s.lat)), s.name+"-cpu-µs/call")
			}
		}
		q := func(s []time.Duration, q float64) float64 {
			return float64(s[int(float64(len(s)-1)*q)]) / float64(time.Microsecond)
		}
		for _, s := range sides {
			slices.Sort(s.lat)
		}
		for _, p := range []struct {
			name string
			q    float64
		}{{"p50", 0.5}, {"p99", 0.99}} {
			direct := q(sides[0].lat, p.q)
			b.ReportMetric(direct, "direct-"+p.name+"-µs")
			added := map[string]float64{}
			for _, s := range sides[1:] {
				added[s.name] = q(s.lat, p.q) - direct
				b.ReportMetric(added[s.name], s.name+"-added-"+p.name+"-µs")
			}
			if added["haproxy"] > 0 {
				for _, s := range sides[2:] {
					b.ReportMetric(added[s.name]/added["haproxy"], s.name+"/haproxy-"+p.name)
				}
			}
		}
	}
	b.StopTimer()
	if profile != "" {
		if err := gwProc.Signal(syscall.SIGUSR2); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if st, err := os.Stat(profile); err == nil && st.Size() > 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("the gateway wrote no CPU profile to %s", profile)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// processCPU is the user and system CPU time process pid has used, from /proc (-1 where there is
// none: then no CPU figure is reported).
func processCPU(pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The fields after the command, which is in parentheses and may hold spaces: utime and
	// stime are the 12th and 13th of them, in clock ticks (USER_HZ, 100 on Linux).
	_, rest, ok := strings.Cut(string(stat), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// haproxyBinary finds haproxy: in PATH, or in /usr/sbin (where Debian puts it, which a
// non-root PATH often lacks).
func haproxyBinary() (string, error) {
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/haproxy"); err == nil {
		return "/usr/sbin/haproxy", nil
	}
	return "", errors.New("haproxy is not installed (apt-get install -y haproxy, or `make bench-gateway`, which does)")
}

// startBenchBackend serves EndpointService on pkg/server on a loopback port and returns its
// address.
func startBenchBackend(ctx context.Context, b testing.TB, tokens string) string {
	b.Helper()
	// Production logging (JSON, info), written nowhere.
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))
	srv, err := server.New(server.Config{TokenFile: tokens}, log)
	if err != nil {
		b.Fatal(err)
	}
	// Everyone authenticated may call: authorization is a service's business, the same on
	// every side.
	srv.Authorize(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc { return next }))
	srv.Handle(endpointv1connect.NewEndpointServiceHandler(fixedEndpoints{answer: benchAnswer()}, srv.HandlerOptions()...))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.ServeListener(ctx, ln) }()
	return ln.Addr().String()
}

// benchAnswer is a service in 20 clusters, one address each: about 900 bytes of JSON, below
// connect's compression threshold.
func benchAnswer() *endpointv1.GetServiceEndpointsResponse {
	a := &endpointv1.GetServiceEndpointsResponse{Namespace: "bench", Name: "cart", Version: 7}
	for i := range 20 {
		a.Clusters = append(a.Clusters, &endpointv1.ClusterEndpoints{
			ClusterId: fmt.Sprintf("c%d", i), ClusterName: fmt.Sprintf("cluster-%d", i), Weight: 100,
			LastSeen:  timestamppb.Now(),
			Addresses: []*endpointv1.Address{{Ip: fmt.Sprintf("10.0.4.%d", i+1), Port: 8080, Weight: 100, Ready: true, Serving: true}},
		})
	}
	return a
}

type fixedEndpoints struct {
	endpointv1connect.UnimplementedEndpointServiceHandler
	answer *endpointv1.GetServiceEndpointsResponse
}

func (f fixedEndpoints) GetServiceEndpoints(context.Context, *connect.Request[endpointv1.GetServiceEndpointsRequest]) (*connect.Response[endpointv1.GetServiceEndpointsResponse], error) {
	return connect.NewResponse(f.answer), nil
}

// freeLoopbackAddr returns a loopback address whose port the kernel just handed out and that
// is free again, for a child process to bind.
func freeLoopbackAddr(b *testing.B) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startGatewayProc runs the gateway binary as deployed (the services' token file, production
// logging, here to /dev/null) in front of backend and returns its address once it is ready.
func startGatewayProc(b *testing.B, bin, backend, tokens, profile string) (string, *os.Process) {
	b.Helper()
	addr := freeLoopbackAddr(b)
	cmd := exec.Command(bin, "--listen", addr, "--token-file", tokens,
		"--route", "fleetstream.endpoint.v1.EndpointService=http://"+backend)
	cmd.Env = append(os.Environ(), strings.Fields(os.Getenv("FLEETSTREAM_BENCH_GATEWAY_ENV"))...)
	if profile != "" {
		cmd.Env = append(cmd.Env, "FLEETSTREAM_GATEWAY_CPUPROFILE="+profile)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start gateway: %v", err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	waitReady(b, "gateway", "http://"+addr+"/readyz")
	return addr, cmd.Process
}

// startHAProxyProc runs haproxy in front of backend as an expert would for this path: mode
// http, keep-alive to the client and to the backend, idle backend connections reused by any
// client (http-reuse always), no logging; its default threads (one per CPU).
func startHAProxyProc(b *testing.B, bin, backend, dir string) (string, *os.Process) {
	b.Helper()
	addr := freeLoopbackAddr(b)
	cfg := fmt.Sprintf(`global
	maxconn 1024

defaults
	mode http
	option http-keep-alive
	http-reuse always
	timeout connect 5s
	timeout client 30s
	timeout server 30s

frontend api
	bind %s
	default_backend services

backend services
	server backend %s
`, addr, backend)
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	// -db: in the foreground, so that killing the process stops it. No log directive: it logs
	// nothing.
	cmd := exec.Command(bin, "-db", "-f", path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("start haproxy: %v", err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	waitReady(b, "haproxy", "http://"+addr+"/readyz")
	return addr, cmd.Process
}

func waitReady(b *testing.B, name, url string) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s at %s not ready after 10 s (last: %v)", name, url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
