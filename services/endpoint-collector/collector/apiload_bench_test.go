package collector

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetstream/fleetstream/pkg/events"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// BenchmarkGetServiceEndpoints: requests/s and latency of GetServiceEndpoints (Connect JSON over
// keep-alive HTTP/1.1, through the server scaffold's interceptors; 2 clusters × 10 endpoints)
// against a bare net/http handler serving the same response bytes from memory, in the same run.
// The load comes from tools/loadgen (vegeta as a library), built into a temporary directory and
// run as its own process, one run per window: 16 workers, as fast as they go, for 0.4 s per
// window, ten windows per server interleaved (which goes first alternates) so that a noisy
// neighbour hurts both alike. "ratio" is the median of the ten windows' ratios, "sum-ratio" the
// ratio of the summed rates; latency figures are medians of the windows' percentiles. The CPU
// time per request of this process (the server) and of the load generator is reported too: on
// a shared machine it moves less than the rates.
//
// Sub-benchmarks: "gzip", the goal's case, with the headers a Connect client sends for a unary
// JSON call (Accept-Encoding: gzip; the bare handler serves a gzip encoding made once, with
// Content-Encoding: gzip, as it is asked); "identity", no compression asked.
//
//	go test -run '^$' -bench GetServiceEndpoints -benchtime 1x -count 2 ./collector/
func BenchmarkGetServiceEndpoints(b *testing.B) {
	bin := buildLoadgen(b)
	for _, gz := range []bool{true, false} {
		name := "identity"
		if gz {
			name = "gzip"
		}
		b.Run(name, func(b *testing.B) { benchmarkGetServiceEndpoints(b, bin, gz) })
	}
}

// buildLoadgen builds tools/loadgen (in this workspace) into a temporary directory.
func buildLoadgen(b *testing.B) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "loadgen")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join("..", "..", "..", "tools", "loadgen")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build tools/loadgen: %v\n%s", err, out)
	}
	return bin
}

// loadReport is the part of tools/loadgen's output read here.
type loadReport struct {
	// Measured here: CPU time of this process (the server, and anything else it runs) and of
	// the load generator during the window, per request.
	serverCPU, clientCPU float64 // µs per request

	Throughput float64 `json:"throughput"`
	Requests   uint64  `json:"requests"`
	Success    float64 `json:"success"`
	Latency    struct {
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
	} `json:"latency_ms"`
	BytesInMean      float64        `json:"bytes_in_mean"`
	ContentEncodings map[string]int `json:"content_encodings"`
	Errors           []string       `json:"errors"`
}

func benchmarkGetServiceEndpoints(b *testing.B, bin string, gz bool) {
	const (
		workers = 16
		window  = 400 * time.Millisecond
		rounds  = 10
	)
	headers := []string{"Content-Type: application/json", "Connect-Protocol-Version: 1"}
	if gz {
		// What connect-go's client sends for a unary call (Connect-Accept-Encoding is for
		// streams); connect-es in a browser gets the same from the browser.
		headers = append(headers, "Accept-Encoding: gzip")
	}
	body := `{"namespace":"bench","name":"cart"}`
	for range b.N {
		js := testkit.StartJetStream(b)
		h := startCollector(b, js.JS, Config{})
		ctx := context.Background()
		for _, cl := range []string{"east", "west"} {
			rep := benchSlice(cl, 1, 0, 10, 0)
			rep.Service = "cart"
			if _, err := events.NewStore(js.JS, "bench").Append(ctx, subjects.AgentEndpointSlice(cl, "bench", rep.Slice), cl, events.Any, rep); err != nil {
				b.Fatal(err)
			}
		}
		url := h.http.URL + "/fleetstream.endpoint.v1.EndpointService/GetServiceEndpoints"
		var resp []byte
		testkit.Eventually(b, 10*time.Second, func() error {
			var err error
			resp, err = probe(url, body, headers, gz)
			if err == nil && !strings.Contains(string(resp), `"west"`) {
				err = fmt.Errorf("not both clusters yet: %s", resp)
			}
			return err
		})

		// The baseline server: the same bytes, and their gzip encoding made once.
		var zbuf bytes.Buffer
		zw := gzip.NewWriter(&zbuf)
		_, _ = zw.Write(resp)
		_ = zw.Close()
		zresp := zbuf.Bytes()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		bare := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			hd := w.Header()
			hd["Content-Type"] = []string{"application/json"}
			hd["Vary"] = []string{"Accept-Encoding"}
			if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
				hd["Content-Encoding"] = []string{"gzip"}
				_, _ = w.Write(zresp)
				return
			}
			_, _ = w.Write(resp)
		})}
		go func() { _ = bare.Serve(ln) }()
		bareURL := "http://" + ln.Addr().String() + "/"
		if got, err := probe(bareURL, body, headers, gz); err != nil || !bytes.Equal(got, resp) {
			b.Fatalf("bare handler: %v %q", err, got)
		}

		run := func(url string) loadReport {
			args := []string{"-url", url, "-body", body, "-workers", fmt.Sprint(workers), "-duration", window.String()}
			for _, hd := range headers {
				args = append(args, "-H", hd)
			}
			cmd := exec.Command(bin, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			cpu0 := processCPU()
			out, err := cmd.Output()
			serverCPU := processCPU() - cpu0
			if err != nil {
				b.Fatalf("loadgen: %v\n%s", err, stderr.Bytes())
			}
			var r loadReport
			if err := json.Unmarshal(out, &r); err != nil {
				b.Fatalf("loadgen output: %v\n%s", err, out)
			}
			want := "identity"
			if gz {
				want = "gzip"
			}
			if r.Success != 1 || len(r.Errors) > 0 || r.ContentEncodings[want] != int(r.Requests) {
				b.Fatalf("loadgen against %s: success %.3f, encodings %v, errors %v", url, r.Success, r.ContentEncodings, r.Errors)
			}
			perReq := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(r.Requests) }
			r.serverCPU = perReq(serverCPU)
			r.clientCPU = perReq(cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime())
			return r
		}
		var ours, base []loadReport
		for i := range rounds {
			if i%2 == 0 {
				base = append(base, run(bareURL))
				ours = append(ours, run(url))
			} else {
				ours = append(ours, run(url))
				base = append(base, run(bareURL))
			}
		}
		_ = bare.Close()
		h.stop()

		sum := func(rs []loadReport, f func(loadReport) float64) (s float64) {
			for _, r := range rs {
				s += f(r)
			}
			return s
		}
		median := func(rs []loadReport, f func(loadReport) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		tput := func(r loadReport) float64 { return r.Throughput }
		p50 := func(r loadReport) float64 { return r.Latency.P50 }
		p99 := func(r loadReport) float64 { return r.Latency.P99 }
		// The ratio is the median of the windows' ratios (each ours against the bare window next
		// to it): a neighbour's burst can halve or double one window, and a mean (or a ratio
		// of sums) follows it.
		ratios := make([]string, rounds)
		pairs := make([]float64, rounds)
		for i := range rounds {
			pairs[i] = ours[i].Throughput / base[i].Throughput
			ratios[i] = fmt.Sprintf("%.2f", pairs[i])
		}
		slices.Sort(pairs)
		pairMedian := (pairs[(rounds-1)/2] + pairs[rounds/2]) / 2
		srvCPU := func(r loadReport) float64 { return r.serverCPU }
		cliCPU := func(r loadReport) float64 { return r.clientCPU }
		b.Logf("per-window ratios %s; our p50/p99 %.2f/%.2f ms, bare %.2f/%.2f ms (medians); %.0f vs %.0f response bytes; "+
			"CPU per request (medians): server %.1f µs vs bare %.1f µs, load generator %.1f µs vs %.1f µs",
			strings.Join(ratios, " "), median(ours, p50), median(ours, p99), median(base, p50), median(base, p99),
			ours[0].BytesInMean, base[0].BytesInMean, median(ours, srvCPU), median(base, srvCPU), median(ours, cliCPU), median(base, cliCPU))
		b.ReportMetric(sum(ours, tput)/rounds, "req/s")
		b.ReportMetric(sum(base, tput)/rounds, "bare-req/s")
		b.ReportMetric(pairMedian, "ratio")
		b.ReportMetric(sum(ours, tput)/sum(base, tput), "sum-ratio")
		b.ReportMetric(median(ours, p50), "p50-ms")
		b.ReportMetric(median(ours, p99), "p99-ms")
		b.ReportMetric(median(ours, p50)/median(base, p50), "p50-ratio")
		b.ReportMetric(median(ours, p99)/median(base, p99), "p99-ratio")
		b.ReportMetric(ours[0].BytesInMean, "resp-bytes")
		b.ReportMetric(median(ours, srvCPU), "server-cpu-µs/req")
		b.ReportMetric(median(base, srvCPU), "bare-server-cpu-µs/req")
	}
}

// processCPU is the CPU time this process has used (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// probe makes one request as the load generator does and returns the response body, decoded:
// gzip-encoded when gz (the test fails otherwise), not encoded when not.
func probe(url, body string, headers []string, gz bool) ([]byte, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	for _, hd := range headers {
		k, v, _ := strings.Cut(hd, ":")
		req.Header.Add(k, strings.TrimSpace(v))
	}
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	r, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	if r.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %d %s", url, r.StatusCode, data)
	}
	switch ce := r.Header.Get("Content-Encoding"); {
	case gz && ce != "gzip":
		return nil, fmt.Errorf("%s: asked for gzip, got Content-Encoding %q", url, ce)
	case !gz && ce != "":
		return nil, fmt.Errorf("%s: asked for no encoding, got Content-Encoding %q", url, ce)
	case gz:
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(zr)
	}
	return data, nil
}
