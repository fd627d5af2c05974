package gateway_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/gateway/gateway"
)

// BenchmarkServeHTTP: the gateway's own per-call work (routing, request id, authentication,
// access log, metrics, the reverse proxy) for one Connect unary call, handed straight to
// ServeHTTP, to an upstream on loopback whose handler only writes a fixed answer. Its allocs/op
// and B/op are the gateway's and net/http's client side; ns/op includes one loopback round
// trip. The baseline, reverseproxy, is a bare httputil.ReverseProxy to the same upstream (no
// authentication, id, log or metrics; the same transport settings). fleetd's
// BenchmarkGatewayLatency is the end-to-end measure.
func BenchmarkServeHTTP(b *testing.B) {
	answer := []byte(`{"endpoints":[` + strings.Repeat(`{"cluster":"west","addresses":["10.0.4.1"],"ready":true},`, 19) +
		`{"cluster":"west","addresses":["10.0.4.1"],"ready":true}]}`)
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	})}
	// HTTP/1.1 and h2c, as the services serve (the gateway polls /readyz over h2c).
	up.Protocols = new(http.Protocols)
	up.Protocols.SetHTTP1(true)
	up.Protocols.SetUnencryptedHTTP2(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = up.Serve(ln) }()
	b.Cleanup(func() { _ = up.Close() })

	tokens := filepath.Join(b.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(adminToken+",admin\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	// Production logging (JSON, info, access log on), written nowhere.
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel))
	gs, err := server.New(server.Config{TokenFile: tokens}, log)
	if err != nil {
		b.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{
		Routes:       map[string]string{"fleetstream.endpoint.v1.EndpointService": "http://" + ln.Addr().String()},
		PollInterval: 20 * time.Millisecond,
	}, gs.Authenticator(), gs.Registry(), log)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = gw.Run(ctx) }()

	upURL := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	bare := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(upURL) },
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, DisableCompression: true},
	}

	const body = `{"namespace":"bench","name":"cart"}`
	call := func(h http.Handler) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/fleetstream.endpoint.v1.EndpointService/GetServiceEndpoints", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+adminToken)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for deadline := time.Now().Add(10 * time.Second); call(gw).Code != http.StatusOK; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			rec := call(gw)
			b.Fatalf("upstream never became ready: %d %s", rec.Code, rec.Body)
		}
	}
	for _, side := range []struct {
		name string
		h    http.Handler
	}{{"gateway", gw}, {"reverseproxy", bare}} {
		b.Run(side.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if rec := call(side.h); rec.Code != http.StatusOK || rec.Body.Len() != len(answer) {
					b.Fatalf("%d %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
