// Command loadgen sends HTTP load at one URL and prints what it measured as one JSON object.
// It is the load generator of the API benchmarks (BenchmarkGetServiceEndpoints in
// services/endpoint-collector/collector): run as its own process, so the client's CPU, garbage
// collector and scheduler are not the server's, as they would be with the load generated inside
// the benchmark binary.
//
// It drives github.com/tsenart/vegeta/v12 as a library: a fixed pool of -workers, each with a
// keep-alive HTTP/1.1 connection (never HTTP/2, never a new connection per request), either as
// fast as the workers go (-rate 0, the default) or at a constant -rate. Responses are read whole
// and not decompressed: with -H 'Accept-Encoding: gzip' the client asks for gzip the way a
// Connect client does for a unary call, and the bytes counted are the compressed ones.
//
//	loadgen -url http://127.0.0.1:8080/pkg.Service/Method -body '{"name":"x"}' \
//	  -H 'Content-Type: application/json' -H 'Connect-Protocol-Version: 1' -H 'Accept-Encoding: gzip' \
//	  -workers 16 -duration 400ms
//
// The attack is preceded by -warmup of unmeasured load on the same connections.
package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

type headers http.Header

func (h headers) String() string { return fmt.Sprint(http.Header(h)) }

func (h headers) Set(s string) error {
	k, v, ok := strings.Cut(s, ":")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("header %q is not 'Name: value'", s)
	}
	http.Header(h).Add(strings.TrimSpace(k), strings.TrimSpace(v))
	return nil
}

// Report is what loadgen prints (durations in milliseconds).
type Report struct {
	URL        string  `json:"url"`
	Workers    int     `json:"workers"`
	Rate       float64 `json:"rate"`        // requests sent per second
	Throughput float64 `json:"throughput"`  // successful responses per second, until the last one arrived
	Requests   uint64  `json:"requests"`    // sent during the measured attack
	Success    float64 `json:"success"`     // share of 2xx/3xx responses
	DurationMS float64 `json:"duration_ms"` // first request sent → last response received
	Latency    struct {
		Mean float64 `json:"mean"`
		P50  float64 `json:"p50"`
		P90  float64 `json:"p90"`
		P99  float64 `json:"p99"`
		Max  float64 `json:"max"`
	} `json:"latency_ms"`
	BytesInMean      float64        `json:"bytes_in_mean"` // response body bytes as received (compressed if so)
	StatusCodes      map[string]int `json:"status_codes"`
	ContentEncodings map[string]int `json:"content_encodings"` // responses per Content-Encoding ("identity" when none)
	Errors           []string       `json:"errors"`
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	hdr := headers{}
	var (
		url      = fs.String("url", "", "target URL (required)")
		method   = fs.String("method", http.MethodPost, "HTTP method")
		body     = fs.String("body", "", "request body")
		workers  = fs.Int("workers", 16, "concurrent clients, one keep-alive connection each")
		rate     = fs.Int("rate", 0, "requests per second; 0 sends as fast as the workers go")
		duration = fs.Duration("duration", time.Second, "measured attack")
		warmup   = fs.Duration("warmup", 50*time.Millisecond, "unmeasured load first, on the same connections")
		timeout  = fs.Duration("timeout", 10*time.Second, "per request")
	)
	fs.Var(hdr, "H", "request header 'Name: value' (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *workers < 1 || *duration <= 0 || *rate < 0 {
		fs.Usage()
		return errors.New("-url, -workers ≥ 1 and -duration > 0 are required")
	}

	// One client for the warm-up and the attack: its connections are kept between the two.
	// Compression is neither added nor undone by the transport: the client asks for what -H says
	// and reads the bytes as sent.
	tr := &http.Transport{
		DialContext:         (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: *workers,
		MaxConnsPerHost:     *workers,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1 only
	}
	client := &http.Client{Transport: tr, Timeout: *timeout}
	target := vegeta.Target{Method: *method, URL: *url, Body: []byte(*body), Header: http.Header(hdr)}
	targeter := vegeta.NewStaticTargeter(target)
	pacer := vegeta.ConstantPacer{Freq: *rate, Per: time.Second}
	attacker := func() *vegeta.Attacker {
		opts := []func(*vegeta.Attacker){vegeta.Client(client), vegeta.Workers(uint64(*workers)), vegeta.Redirects(vegeta.NoFollow)}
		if *rate == 0 {
			opts = append(opts, vegeta.MaxWorkers(uint64(*workers))) // max rate: a fixed pool
		}
		return vegeta.NewAttacker(opts...)
	}

	if *warmup > 0 {
		for res := range attacker().Attack(targeter, pacer, *warmup, "warmup") {
			if res.Error != "" {
				return fmt.Errorf("warm-up: %s", res.Error)
			}
		}
	}

	var m vegeta.Metrics
	enc := map[string]int{}
	for res := range attacker().Attack(targeter, pacer, *duration, "attack") {
		m.Add(res)
		ce := res.Headers.Get("Content-Encoding")
		if ce == "" {
			ce = "identity"
		}
		enc[ce]++
	}
	m.Close()

	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	r := Report{URL: *url, Workers: *workers, Rate: m.Rate, Throughput: m.Throughput, Requests: m.Requests,
		Success: m.Success, DurationMS: ms(m.Duration + m.Wait), BytesInMean: m.BytesIn.Mean,
		StatusCodes: m.StatusCodes, ContentEncodings: enc, Errors: m.Errors}
	r.Latency.Mean, r.Latency.P50, r.Latency.P90 = ms(m.Latencies.Mean), ms(m.Latencies.P50), ms(m.Latencies.P90)
	r.Latency.P99, r.Latency.Max = ms(m.Latencies.P99), ms(m.Latencies.Max)
	out := json.NewEncoder(stdout)
	out.SetIndent("", "  ")
	return out.Encode(r)
}
