package fleetd_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
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
// connection, straight to the serving process (fleetd) and through the gateway in front of it
// (cleartext HTTP/2 upstream, authentication at both, as in the compose stack), in interleaved
// blocks of the same run. The bar: the gateway adds ≤ 10% at p50.
func BenchmarkGatewayLatency(b *testing.B) {
	const (
		samples = 600 // per side, so p99 is a real p99
		block   = 20
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inst, tokens := startBenchFleet(ctx, b, "token-admin,admin\n", prodLogger())
	reportCart(ctx, b, inst)
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
	direct, through := "http://"+inst.Addr+proc, "http://"+ln.Addr().String()+proc
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
	for _, u := range []string{direct, through} {
		testkit.Eventually(b, 10*time.Second, func() error { _, err := call(u); return err })
	}
	for range b.N {
		var d, g []time.Duration
		for len(d) < samples {
			for _, side := range []struct {
				url string
				out *[]time.Duration
			}{{direct, &d}, {through, &g}} {
				for range block {
					t, err := call(side.url)
					if err != nil {
						b.Fatal(err)
					}
					*side.out = append(*side.out, t)
				}
			}
		}
		slices.Sort(d)
		slices.Sort(g)
		p := func(s []time.Duration, q float64) float64 { return float64(s[int(float64(len(s)-1)*q)].Microseconds()) }
		b.ReportMetric(p(d, 0.5), "direct-p50-µs")
		b.ReportMetric(p(g, 0.5), "gateway-p50-µs")
		b.ReportMetric(p(d, 0.99), "direct-p99-µs")
		b.ReportMetric(p(g, 0.99), "gateway-p99-µs")
		b.ReportMetric(p(g, 0.5)/p(d, 0.5), "p50-ratio")
	}
}

func prodLogger() *zap.Logger {
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))
}
