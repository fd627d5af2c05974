package collector

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1/endpointv1connect"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

// serveCodecs serves c's API with its codecs and compressor and the server scaffold's minimum
// for compression, without the scaffold's interceptors.
func serveCodecs(t *testing.T, c *Collector) string {
	t.Helper()
	path, h := endpointv1connect.NewEndpointServiceHandler(c, append(c.codecOptions(), connect.WithCompressMinBytes(1024))...)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/fleetstream.endpoint.v1.EndpointService/GetServiceEndpoints"
}

// post sends a unary Connect call as a client asking for gzip (or not) does, and returns the
// body as sent and decoded.
func post(t *testing.T, url, contentType string, body []byte, gz bool) (sent, decoded []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Connect-Protocol-Version", "1")
	if gz {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	r, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	sent, err = io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", r.StatusCode, sent)
	}
	ce := r.Header.Get("Content-Encoding")
	if !gz {
		if ce != "" {
			t.Fatalf("no compression asked, got Content-Encoding %q", ce)
		}
		return sent, sent
	}
	if ce != "gzip" {
		t.Fatalf("gzip asked, got Content-Encoding %q", ce)
	}
	zr, err := gzip.NewReader(bytes.NewReader(sent))
	if err != nil {
		t.Fatal(err)
	}
	decoded, err = io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return sent, decoded
}

func indexed(r *responseCodec) (n int) {
	r.gz.Range(func(any, any) bool { n++; return true })
	return n
}

// checkGzipIndex checks the gzip index against the cache's entries: every entry's gzipped is
// indexed and counts it as a holder, and every indexed gzipped is held.
func checkGzipIndex(t testing.TB, r *responseCodec) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	held := map[*gzipped]int{}
	for _, c := range r.ring {
		for _, g := range c.gz {
			if g == nil {
				continue
			}
			held[g]++
			if v, ok := r.gz.Load(g.hash); !ok || v != g {
				t.Fatalf("an entry's gzipped is not indexed")
			}
		}
	}
	r.gz.Range(func(_, v any) bool {
		g := v.(*gzipped)
		if held[g] == 0 || held[g] != len(g.refs) {
			t.Fatalf("an indexed gzipped has %d holders and counts %d", held[g], len(g.refs))
		}
		return true
	})
}

// A client asking for gzip gets the gzip of the cached encoding, made once per response and
// encoding, for JSON and binary alike; the bytes decode to what a client asking for no
// compression gets. A response that is not cached is compressed per request, as Connect would.
func TestGzipOfCachedResponses(t *testing.T) {
	c := memCollector(t, Config{}, 2, 10)
	url := serveCodecs(t, c)
	jsonReq := []byte(`{"namespace":"bench","name":"svc-0"}`)
	_, plain := post(t, url, "application/json", jsonReq, false)
	if len(plain) < 1024 {
		t.Fatalf("a %d-byte response is not compressed at all: the test needs a larger one", len(plain))
	}
	var first []byte
	for i := range 5 {
		sent, decoded := post(t, url, "application/json", jsonReq, true)
		if !bytes.Equal(decoded, plain) {
			t.Fatalf("request %d: gzip decodes to\n%s\nnot\n%s", i, decoded, plain)
		}
		if first == nil {
			first = sent
		} else if !bytes.Equal(sent, first) {
			t.Fatalf("request %d: other gzip bytes than the first", i)
		}
	}
	if made, per := c.codec.gzipsCached.Load(), c.codec.gzipsPerRequest.Load(); made != 1 || per != 0 {
		t.Errorf("5 gzip requests of one cached response: %d gzips cached, %d made per request; want 1 and 0", made, per)
	}

	// The binary encoding has its own.
	binReq, _ := proto.Marshal(&endpointv1.GetServiceEndpointsRequest{Namespace: "bench", Name: "svc-0"})
	_, plainBin := post(t, url, "application/proto", binReq, false)
	for range 3 {
		if _, decoded := post(t, url, "application/proto", binReq, true); !bytes.Equal(decoded, plainBin) {
			t.Fatal("binary: gzip decodes to other bytes")
		}
	}
	if made, per := c.codec.gzipsCached.Load(), c.codec.gzipsPerRequest.Load(); made != 2 || per != 0 {
		t.Errorf("after binary requests: %d gzips cached, %d made per request; want 2 and 0", made, per)
	}
	checkAccounts(t, c.codec)

	// With the cache off, every response is compressed per request.
	off := memCollector(t, Config{ResponseCacheBytes: -1}, 1, 10)
	offURL := serveCodecs(t, off)
	_, plainOff := post(t, offURL, "application/json", jsonReq, false)
	for range 2 {
		if _, decoded := post(t, offURL, "application/json", jsonReq, true); !bytes.Equal(decoded, plainOff) {
			t.Fatal("uncached: gzip decodes to other bytes")
		}
	}
	if made, per := off.codec.gzipsCached.Load(), off.codec.gzipsPerRequest.Load(); made != 0 || per != 2 {
		t.Errorf("cache off, 2 gzip requests: %d gzips cached, %d made per request; want 0 and 2", made, per)
	}

	// A new snapshot: the superseded gzips leave the index with their entries.
	rep := benchSlice("east", 0, 0, 10, 1)
	if err := c.ingest.handle(subjects.AgentEndpointSlice("east", "bench", rep.Slice), encodeReport(t, rep), time.Now()); err != nil {
		t.Fatal(err)
	}
	key, _ := c.queue.Get()
	c.reconcile(key)
	c.queue.Done(key)
	if n := indexed(c.codec); n != 0 {
		t.Errorf("%d gzips indexed after the only cached service changed", n)
	}
	_, plain2 := post(t, url, "application/json", jsonReq, false)
	if _, decoded := post(t, url, "application/json", jsonReq, true); !bytes.Equal(decoded, plain2) || bytes.Equal(plain2, plain) {
		t.Error("after the change: gzip does not decode to the new response")
	}
	checkAccounts(t, c.codec)
}

// Entries whose encodings are the same bytes share one encoding and one gzip: READY and
// READY_OR_TERMINATING of a service with ready endpoints. The gzip stays indexed while one of
// them is cached.
func TestGzipSharedBySameEncodings(t *testing.T) {
	c := memCollector(t, Config{}, 1, 10)
	url := serveCodecs(t, c)
	req := func(filter endpointv1.EndpointFilter) []byte {
		return []byte(fmt.Sprintf(`{"namespace":"bench","name":"svc-0","filter":%d}`, filter))
	}
	ready, readyOrTerm := endpointv1.EndpointFilter_ENDPOINT_FILTER_READY, endpointv1.EndpointFilter_ENDPOINT_FILTER_READY_OR_TERMINATING
	_, a := post(t, url, "application/json", req(ready), true)
	_, b := post(t, url, "application/json", req(readyOrTerm), true)
	if !bytes.Equal(a, b) {
		t.Fatal("READY and READY_OR_TERMINATING differ: the test needs them the same")
	}
	sn := c.store.snapshot("bench/svc-0")
	slots := sn.resp.Load()
	if slots == nil {
		t.Fatal("nothing cached")
	}
	ca, cb := slots[ready].Load(), slots[readyOrTerm].Load()
	if ca == nil || cb == nil || ca == cb {
		t.Fatal("the two filters are not two cache entries")
	}
	if &ca.json[0] != &cb.json[0] || ca.gz[encJSON] != cb.gz[encJSON] {
		t.Error("the same encoding is held twice")
	}
	if n, made := indexed(c.codec), c.codec.gzipsCached.Load(); n != 1 || made != 1 {
		t.Errorf("%d gzips indexed, %d made; want 1 and 1", n, made)
	}
	checkAccounts(t, c.codec)

	c.codec.forget(ca)
	checkGzipIndex(t, c.codec)
	if _, decoded := post(t, url, "application/json", req(readyOrTerm), true); !bytes.Equal(decoded, b) {
		t.Fatal("gzip decodes to other bytes")
	}
	if per := c.codec.gzipsPerRequest.Load(); per != 0 {
		t.Errorf("the remaining entry's gzip was made again (%d per request)", per)
	}
	c.codec.forget(cb)
	if n := indexed(c.codec); n != 0 {
		t.Errorf("%d gzips indexed with no entry cached", n)
	}
}

// The compressor compresses what it is not given whole in one write, and what it does not know,
// as gzip.Writer does.
func TestGzipCompressorFallback(t *testing.T) {
	c := memCollector(t, Config{}, 1, 10)
	msg := c.store.snapshot("bench/svc-0").response(c.env, endpointv1.EndpointFilter_ENDPOINT_FILTER_READY, "")
	enc, err := (&jsonCodec{r: c.codec}).Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	z := &gzipCompressor{r: c.codec}
	for _, pieces := range [][][]byte{
		{enc},                     // cached
		{enc[:100], enc[100:]},    // cached bytes, in two writes
		{[]byte("other bytes")},   // unknown
		{enc, []byte("trailing")}, // cached, then more
		{},                        // nothing
	} {
		var out bytes.Buffer
		z.Reset(&out)
		for _, p := range pieces {
			if _, err := z.Write(p); err != nil {
				t.Fatal(err)
			}
		}
		if err := z.Close(); err != nil {
			t.Fatal(err)
		}
		z.Reset(io.Discard)
		zr, err := gzip.NewReader(&out)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		if want := bytes.Join(pieces, nil); !bytes.Equal(got, want) {
			t.Errorf("%d pieces: decoded %q, want %q", len(pieces), abbrev(got), abbrev(want))
		}
	}
	if made, per := c.codec.gzipsCached.Load(), c.codec.gzipsPerRequest.Load(); made != 1 || per != 4 {
		t.Errorf("%d gzips cached, %d per request; want 1 and 4", made, per)
	}
}

func abbrev(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "…"
	}
	return string(b)
}
