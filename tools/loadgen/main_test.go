package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// loadgen sends what it is told, over keep-alive HTTP/1.1 connections (at most one per worker),
// and reports what came back, responses counted by Content-Encoding.
func TestLoadgen(t *testing.T) {
	var (
		mu      sync.Mutex
		remotes = map[string]bool{}
		bad     []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes[r.RemoteAddr] = true
		var b bytes.Buffer
		_, _ = b.ReadFrom(r.Body)
		if r.Method != http.MethodPost || r.ProtoMajor != 1 || b.String() != `{"a":1}` || r.Header.Get("Accept-Encoding") != "gzip" || r.Header.Get("X-Two") != "b c" {
			bad = append(bad, r.Method+" "+r.Proto+" "+b.String()+" "+r.Header.Get("Accept-Encoding"))
		}
		mu.Unlock()
		w.Header().Set("Content-Encoding", "gzip")
		_, _ = w.Write([]byte("0123456789"))
	}))
	defer srv.Close()

	var out bytes.Buffer
	err := run([]string{"-url", srv.URL, "-body", `{"a":1}`, "-workers", "3", "-duration", "200ms",
		"-H", "Accept-Encoding: gzip", "-H", "X-Two: b c"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.Bytes())
	}
	if r.Requests == 0 || r.Success != 1 || r.Throughput <= 0 || r.Latency.P50 <= 0 || r.Latency.P99 < r.Latency.P50 {
		t.Errorf("report: %s", out.Bytes())
	}
	if r.ContentEncodings["gzip"] != int(r.Requests) || r.BytesInMean != 10 || r.StatusCodes["200"] != int(r.Requests) {
		t.Errorf("responses: %s", out.Bytes())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("%d requests not as told, e.g. %q", len(bad), bad[0])
	}
	if len(remotes) > 3 {
		t.Errorf("%d connections for 3 workers: %s", len(remotes), strings.Join(keys(remotes), " "))
	}
}

func keys(m map[string]bool) (out []string) {
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestLoadgenRefusesNoURL(t *testing.T) {
	if err := run([]string{"-duration", "1s"}, &bytes.Buffer{}); err == nil {
		t.Error("no -url: no error")
	}
}
