package fleetd_test

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
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/gateway/gateway"
)

// BenchmarkGatewayLatency: GetServiceEndpoints latency of one client with a keep-alive
// connection, straight to the serving process (fleetd), through haproxy in front of it (the
// baseline: what an out-of-process expert proxy costs on the same loopback, when haproxy is in
// PATH), through the gateway in this test process ("gateway") and through the gateway as its
// own process, as compose runs it ("gatewayproc"; authentication at the gateway and at fleetd),
// in interleaved blocks of the same run. The bar: the gateway adds ≤ 10% at p50.
func BenchmarkGatewayLatency(b *testing.B) {
	const (
		samples = 600 // per side, so p99 is a real p99
		block   = 20
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inst, tokens := startBenchFleet(ctx, b, "token-admin,admin\n", prodLogger())
	reportCart(ctx, b, inst, "bench")
	// Logs as in production (JSON, info, access log on), written nowhere: the test log would
	// make every access-log line a locked, formatted write into the benchmark's output.
	prodLog := prodLogger()
	gs, err := server.New(server.Config{TokenFile: tokens}, prodLog)
	if err != nil {
		b.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Routes: map[string]string{"fleetstream.endpoint.v1.EndpointService": "http://" + inst.Addr},
		PollInterval: time.Second}, gs.Authenticator(), gs.Registry(), prodLog)
	if err != nil {
		b.Fatal(err)
	}
	gw.Mount(gs)
	go func() { _ = gw.Run(ctx) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = gs.ServeListener(ctx, ln) }()

	const proc = "/fleetstream.endpoint.v1.EndpointService/GetServiceEndpoints"
	type side struct {
		name, url string
		lat       []time.Duration
	}
	sides := []*side{{name: "direct", url: "http://" + inst.Addr + proc}}
	if addr, err := startHAProxy(b, inst.Addr); err != nil {
		b.Logf("haproxy side skipped: %v", err)
	} else {
		sides = append(sides, &side{name: "haproxy", url: "http://" + addr + proc})
	}
	sides = append(sides, &side{name: "gateway", url: "http://" + ln.Addr().String() + proc})
	bin, err := buildGateway(b)
	if err != nil {
		b.Logf("gateway-process side skipped: %v", err)
	} else if addr, err := startGatewayProcess(b, bin, inst.Addr, tokens); err != nil {
		b.Logf("gateway-process side skipped: %v", err)
	} else {
		sides = append(sides, &side{name: "gatewayproc", url: "http://" + addr + proc})
	}
	// Other gateway binaries (an older commit's, say) as further sides of the same run: a
	// change to the gateway process is only measurable against its predecessor interleaved
	// with it, as runs on this machine differ more than most changes do.
	for _, nb := range strings.Fields(strings.ReplaceAll(os.Getenv("FLEETSTREAM_BENCH_GATEWAYS"), ",", " ")) {
		name, bin, ok := strings.Cut(nb, "=")
		if !ok {
			b.Fatalf("FLEETSTREAM_BENCH_GATEWAYS: %q: want name=/path/to/gateway", nb)
		}
		addr, err := startGatewayProcess(b, bin, inst.Addr, tokens)
		if err != nil {
			b.Fatalf("gateway %s: %v", name, err)
		}
		sides = append(sides, &side{name: "gatewayproc-" + name, url: "http://" + addr + proc})
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	call := func(url string) (time.Duration, error) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"namespace":"bench","name":"cart"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer token-admin")
		start := time.Now()
		res, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		d := time.Since(start)
		if res.StatusCode != 200 || !strings.Contains(string(body), `"west"`) {
			return 0, fmt.Errorf("%s: %d %s", url, res.StatusCode, body)
		}
		return d, nil
	}
	for _, s := range sides {
		testkit.Eventually(b, 10*time.Second, func() error { _, err := call(s.url); return err })
	}
	for range b.N {
		for _, s := range sides {
			s.lat = s.lat[:0]
		}
		for len(sides[0].lat) < samples {
			for _, s := range sides {
				for range block {
					t, err := call(s.url)
					if err != nil {
						b.Fatal(err)
					}
					s.lat = append(s.lat, t)
				}
			}
		}
		p := func(s []time.Duration, q float64) float64 { return float64(s[int(float64(len(s)-1)*q)].Microseconds()) }
		for _, s := range sides {
			slices.Sort(s.lat)
		}
		direct := p(sides[0].lat, 0.5)
		added := map[string]float64{}
		for _, s := range sides {
			b.ReportMetric(p(s.lat, 0.5), s.name+"-p50-µs")
			b.ReportMetric(p(s.lat, 0.99), s.name+"-p99-µs")
			if s.name != "direct" {
				b.ReportMetric(p(s.lat, 0.5)/direct, s.name+"-p50-ratio")
				added[s.name] = p(s.lat, 0.5) - direct
				b.ReportMetric(added[s.name], s.name+"-added-µs")
			}
		}
		if h, ok := added["haproxy"]; ok && h > 0 {
			// How many haproxies' worth of latency the gateway adds.
			b.ReportMetric(added["gateway"]/h, "added-gateway/haproxy")
			for _, s := range sides {
				if strings.HasPrefix(s.name, "gatewayproc") {
					b.ReportMetric(added[s.name]/h, "added-"+s.name+"/haproxy")
				}
			}
		}
	}
}

// startHAProxy runs haproxy as an HTTP reverse proxy in front of upstream (host:port) on a free
// loopback port, configured as an expert would for this: mode http, keep-alive connections to
// the upstream reused by any client (http-reuse always), no logging. It returns its address, or
// an error saying why there is no haproxy side (not in PATH: CI does not install it).
func startHAProxy(b *testing.B, upstream string) (string, error) {
	b.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		return "", errors.New("haproxy is not in PATH (apt-get install haproxy to measure the baseline)")
	}
	// A free port: taken from the kernel and released for haproxy to bind. Nothing else on the
	// machine is expected to grab it in between.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := fmt.Sprintf(`global
	maxconn 1024

defaults
	mode http
	timeout connect 5s
	timeout client 30s
	timeout server 30s
	option http-keep-alive
	http-reuse always

frontend bench
	bind %s
	default_backend fleetd

backend fleetd
	server fleetd %s
`, addr, upstream)
	path := filepath.Join(b.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return "", err
	}
	// -db: foreground, so that killing the process stops it; no log directive anywhere, so it
	// logs nothing.
	cmd := exec.Command(bin, "-db", "-f", path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start haproxy: %w", err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return addr, nil
}

// buildGateway builds cmd/gateway of this tree and returns the binary's path.
func buildGateway(b *testing.B) (string, error) {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "gateway")
	build := exec.Command("go", "build", "-o", bin, "github.com/fleetstream/fleetstream/services/gateway/cmd/gateway")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build cmd/gateway: %w: %s", err, out)
	}
	return bin, nil
}

// startGatewayProcess runs the gateway binary bin as its own process in front of upstream
// (host:port) on a free loopback port, as compose deploys it: the same token file, production
// logging (to /dev/null). It returns its address once it is ready, or why there is none.
func startGatewayProcess(b *testing.B, bin, upstream, tokens string) (string, error) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "--listen", addr, "--token-file", tokens,
		"--route", "fleetstream.endpoint.v1.EndpointService=http://"+upstream, "--upstream-check-interval", "1s")
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start gateway: %w", err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return addr, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("gateway process at %s not ready after 10 s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func prodLogger() *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))
}
