package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/fleetstream/fleetstream/pkg/console"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	"github.com/fleetstream/fleetstream/pkg/identity"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/pkg/server/oidctest"
	"github.com/fleetstream/fleetstream/services/gateway/gateway"
)

const (
	adminToken = "tok-admin-0123456789"
	maxBytes   = 4096
)

// clusters is a ClusterService upstream that tells the caller what it saw: the caller (from
// its own authentication) and the request id.
type clusters struct {
	clusterv1connect.UnimplementedClusterServiceHandler
	calls   atomic.Int64
	release chan struct{}
}

func (c *clusters) ListClusters(ctx context.Context, req *connect.Request[clusterv1.ListClustersRequest]) (*connect.Response[clusterv1.ListClustersResponse], error) {
	c.calls.Add(1)
	return connect.NewResponse(&clusterv1.ListClustersResponse{Clusters: []*clusterv1.Cluster{{
		Name:   "seen-by-cluster-service",
		Labels: map[string]string{"actor": identity.ActorFrom(ctx), "request-id": req.Header().Get(gateway.RequestIDHeader)},
	}}}), nil
}

func (c *clusters) RegisterCluster(_ context.Context, req *connect.Request[clusterv1.RegisterClusterRequest]) (*connect.Response[clusterv1.RegisterClusterResponse], error) {
	c.calls.Add(1)
	return connect.NewResponse(&clusterv1.RegisterClusterResponse{Cluster: &clusterv1.Cluster{Name: req.Msg.GetName()}}), nil
}

// WatchClusters sends one event, waits for the test to release it, then sends another: the
// first must reach the client while the stream is still open.
func (c *clusters) WatchClusters(ctx context.Context, _ *connect.Request[clusterv1.WatchClustersRequest], s *connect.ServerStream[clusterv1.WatchClustersResponse]) error {
	c.calls.Add(1)
	if err := s.Send(&clusterv1.WatchClustersResponse{Cluster: &clusterv1.Cluster{Name: "first"}}); err != nil {
		return err
	}
	select {
	case <-c.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Send(&clusterv1.WatchClustersResponse{Cluster: &clusterv1.Cluster{Name: "second"}})
}

type projects struct {
	projectv1connect.UnimplementedProjectServiceHandler
	calls atomic.Int64
}

func (p *projects) GetProject(_ context.Context, req *connect.Request[projectv1.GetProjectRequest]) (*connect.Response[projectv1.GetProjectResponse], error) {
	p.calls.Add(1)
	return connect.NewResponse(&projectv1.GetProjectResponse{Project: &projectv1.Project{Name: req.Msg.GetName(), DisplayName: "from project service"}}), nil
}

// allow is the authorizer of the test upstreams: the gateway never authorizes, so what the
// services decide does not matter here.
type allow struct{}

func (allow) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }
func (allow) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}
func (allow) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// serve runs srv on a fresh loopback port until the test ends (or stop is called) and returns
// its base URL.
func serve(t *testing.T, srv *server.Server) (base string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeListener(ctx, ln)
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return "http://" + ln.Addr().String(), stop
}

type fixture struct {
	gw         string
	clusters   *clusters
	projects   *projects
	projectsUp string // host:port of the project service
	down       *atomic.Bool
	stopProj   func()
	logs       *observer.ObservedLogs
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(adminToken+",admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := server.Config{TokenFile: tokens}
	log := zap.NewNop()
	f := &fixture{clusters: &clusters{release: make(chan struct{})}, projects: &projects{}, down: &atomic.Bool{}}

	cs, err := server.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	cs.Authorize(allow{})
	cs.Handle(clusterv1connect.NewClusterServiceHandler(f.clusters, cs.HandlerOptions()...))
	csURL, _ := serve(t, cs)

	ps, err := server.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ps.Authorize(allow{})
	ps.Handle(projectv1connect.NewProjectServiceHandler(f.projects, ps.HandlerOptions()...))
	ps.AddCheck("toggle", func(context.Context) error {
		if f.down.Load() {
			return errors.New("down for the test")
		}
		return nil
	})
	var psURL string
	psURL, f.stopProj = serve(t, ps)
	f.projectsUp = strings.TrimPrefix(psURL, "http://")

	core, logs := observer.New(zap.InfoLevel)
	f.logs = logs
	gs, err := server.New(server.Config{TokenFile: tokens}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{
		Routes: map[string]string{
			"fleetstream.cluster.v1.ClusterService": csURL,
			"fleetstream.project.v1.ProjectService": psURL,
		},
		MaxRequestBytes: maxBytes,
		PollInterval:    50 * time.Millisecond,
	}, gs.Authenticator(), gs.Registry(), zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	gw.Mount(gs)
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = gw.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-runDone })
	f.gw, _ = serve(t, gs)
	waitFor(t, "gateway ready", func() bool { code, _ := get(t, f.gw+"/readyz"); return code == http.StatusOK })
	return f
}

// waitFor polls cond for up to 10 s. It is not testkit.Eventually because testkit would bring
// Kubernetes' client libraries (its kube-apiserver helpers) into this module's dependencies.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // paces the poll
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// postJSON makes a Connect unary JSON call with curl's shape.
func postJSON(t *testing.T, url, token string, hdr map[string]string, body io.Reader) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func connectCode(t *testing.T, body string) string {
	t.Helper()
	var e struct{ Code, Message string }
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not a Connect JSON error: %q: %v", body, err)
	}
	return e.Code
}

// h2c is an HTTP/2-without-TLS client, as gRPC needs.
func h2c() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}}
}

func withToken[T any](m *T) *connect.Request[T] {
	r := connect.NewRequest(m)
	r.Header().Set("Authorization", "Bearer "+adminToken)
	return r
}

func TestUnaryConnectJSONRoutesByService(t *testing.T) {
	f := newFixture(t)
	res, body := postJSON(t, f.gw+clusterv1connect.ClusterServiceListClustersProcedure, adminToken, nil, strings.NewReader("{}"))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("ListClusters: HTTP %d %s", res.StatusCode, body)
	}
	var lr struct {
		Clusters []struct {
			Name   string
			Labels map[string]string
		}
	}
	if err := json.Unmarshal([]byte(body), &lr); err != nil || len(lr.Clusters) != 1 {
		t.Fatalf("ListClusters answer %q: %v", body, err)
	}
	if got := lr.Clusters[0].Labels["actor"]; got != "admin" {
		t.Errorf("upstream authenticated the forwarded call as %q, want admin (Authorization kept)", got)
	}
	// Routing: ProjectService goes to the other upstream.
	res, body = postJSON(t, f.gw+projectv1connect.ProjectServiceGetProjectProcedure, adminToken, nil, strings.NewReader(`{"name":"team-a"}`))
	if res.StatusCode != http.StatusOK || !strings.Contains(body, "from project service") {
		t.Fatalf("GetProject: HTTP %d %s", res.StatusCode, body)
	}
	if f.clusters.calls.Load() != 1 || f.projects.calls.Load() != 1 {
		t.Errorf("calls: cluster service %d, project service %d; want 1 each", f.clusters.calls.Load(), f.projects.calls.Load())
	}
	// The access log: one line per call, with the caller and never the token. A line is written
	// after its response went out, so the client may read the answer first: wait for both.
	waitFor(t, "two access log lines", func() bool { return f.logs.FilterMessage("request").Len() >= 2 })
	var lines int
	for _, e := range f.logs.FilterMessage("request").All() {
		lines++
		m := e.ContextMap()
		if m["user"] != "admin" || m["request_id"] == "" || m["status"] != int64(200) {
			t.Errorf("access log line %v", m)
		}
	}
	if lines != 2 {
		t.Errorf("%d access log lines, want 2", lines)
	}
	for _, e := range f.logs.All() {
		if strings.Contains(fmt.Sprint(e.Message, e.ContextMap()), adminToken) {
			t.Errorf("the token was logged: %v", e.ContextMap())
		}
	}
}

// The gateway never parses a message; the service behind it decodes strictly, and its refusal
// reaches the client unchanged: a Connect JSON request with a field the service does not know is
// invalid_argument naming the field, before the handler runs. Binary requests keep unknown
// fields.
func TestUnknownJSONFieldsAreRefusedThroughTheGateway(t *testing.T) {
	f := newFixture(t)
	res, body := postJSON(t, f.gw+clusterv1connect.ClusterServiceRegisterClusterProcedure, adminToken, nil,
		strings.NewReader(`{"name":"c1","labels":{"env":"prod"},"celSelector":{"celExpressions":["true"]}}`))
	if res.StatusCode != http.StatusBadRequest || connectCode(t, body) != "invalid_argument" || !strings.Contains(body, "celSelector: unknown field") {
		t.Fatalf("RegisterCluster with celSelector: HTTP %d %s", res.StatusCode, body)
	}
	if n := f.clusters.calls.Load(); n != 0 {
		t.Fatalf("the service's handler ran %d times for a refused request", n)
	}
	req := &clusterv1.RegisterClusterRequest{Name: "c1"}
	req.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 999, protowire.VarintType), 1))
	resp, err := clusterv1connect.NewClusterServiceClient(h2c(), f.gw, connect.WithGRPC()).RegisterCluster(t.Context(), withToken(req))
	if err != nil || resp.Msg.GetCluster().GetName() != "c1" {
		t.Fatalf("gRPC RegisterCluster with an unknown field: %v", err)
	}
}

func TestGRPCAndGRPCWebThroughTheGateway(t *testing.T) {
	f := newFixture(t)
	for name, c := range map[string]clusterv1connect.ClusterServiceClient{
		"grpc":     clusterv1connect.NewClusterServiceClient(h2c(), f.gw, connect.WithGRPC()),
		"grpc-web": clusterv1connect.NewClusterServiceClient(http.DefaultClient, f.gw, connect.WithGRPCWeb()),
		"connect":  clusterv1connect.NewClusterServiceClient(http.DefaultClient, f.gw),
	} {
		res, err := c.ListClusters(t.Context(), withToken(&clusterv1.ListClustersRequest{}))
		if err != nil {
			t.Fatalf("%s ListClusters: %v", name, err)
		}
		if got := res.Msg.GetClusters()[0].GetLabels()["actor"]; got != "admin" {
			t.Errorf("%s: upstream saw actor %q", name, got)
		}
		if res.Header().Get(gateway.RequestIDHeader) == "" {
			t.Errorf("%s: no request id in the response", name)
		}
		// Errors the gateway makes reach every protocol as codes.
		_, err = c.ListClusters(t.Context(), connect.NewRequest(&clusterv1.ListClustersRequest{}))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("%s without a token: %v, want unauthenticated", name, err)
		}
	}
	pc := projectv1connect.NewProjectServiceClient(h2c(), f.gw, connect.WithGRPC())
	res, err := pc.GetProject(t.Context(), withToken(&projectv1.GetProjectRequest{Name: "team-a"}))
	if err != nil || res.Msg.GetProject().GetDisplayName() != "from project service" {
		t.Fatalf("gRPC GetProject: %v %v", res, err)
	}
}

func TestServerStreamPassesThroughUnbuffered(t *testing.T) {
	f := newFixture(t)
	for name, c := range map[string]clusterv1connect.ClusterServiceClient{
		"grpc":    clusterv1connect.NewClusterServiceClient(h2c(), f.gw, connect.WithGRPC()),
		"connect": clusterv1connect.NewClusterServiceClient(http.DefaultClient, f.gw),
	} {
		f.clusters.release = make(chan struct{})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		stream, err := c.WatchClusters(ctx, withToken(&clusterv1.WatchClustersRequest{}))
		if err != nil {
			t.Fatalf("%s WatchClusters: %v", name, err)
		}
		// The upstream holds the stream open after the first event: it must arrive now.
		if !stream.Receive() || stream.Msg().GetCluster().GetName() != "first" {
			t.Fatalf("%s: first event: %v", name, stream.Err())
		}
		close(f.clusters.release)
		if !stream.Receive() || stream.Msg().GetCluster().GetName() != "second" {
			t.Fatalf("%s: second event: %v", name, stream.Err())
		}
		if stream.Receive() {
			t.Fatalf("%s: unexpected third event", name)
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("%s: stream ended with %v (trailers lost?)", name, err)
		}
		_ = stream.Close()
		cancel()
	}
}

func TestUnknownServiceIsUnimplemented(t *testing.T) {
	f := newFixture(t)
	for _, path := range []string{"/fleetstream.nope.v1.NopeService/Get", "/", "/fleetstream.cluster.v1.ClusterService"} {
		res, body := postJSON(t, f.gw+path, adminToken, nil, strings.NewReader("{}"))
		if res.StatusCode != http.StatusNotFound || connectCode(t, body) != "unimplemented" {
			t.Errorf("%s: HTTP %d %s, want 404 unimplemented", path, res.StatusCode, body)
		}
	}
	c := connect.NewClient[clusterv1.ListClustersRequest, clusterv1.ListClustersResponse](h2c(), f.gw+"/fleetstream.nope.v1.NopeService/List", connect.WithGRPC())
	_, err := c.CallUnary(t.Context(), withToken(&clusterv1.ListClustersRequest{}))
	if connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("gRPC to an unknown service: %v, want unimplemented", err)
	}
}

func TestUnauthenticatedIsRefusedAtTheGateway(t *testing.T) {
	f := newFixture(t)
	for _, token := range []string{"", "wrong-token"} {
		res, body := postJSON(t, f.gw+clusterv1connect.ClusterServiceListClustersProcedure, token, nil, strings.NewReader("{}"))
		if res.StatusCode != http.StatusUnauthorized || connectCode(t, body) != "unauthenticated" {
			t.Errorf("token %q: HTTP %d %s, want 401 unauthenticated", token, res.StatusCode, body)
		}
		if strings.Contains(body, "wrong-token") {
			t.Errorf("the error echoes the token: %s", body)
		}
	}
	if n := f.clusters.calls.Load(); n != 0 {
		t.Errorf("the upstream was called %d times", n)
	}
	// Health, readiness and metrics stay open.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if code, body := get(t, f.gw+p); code != http.StatusOK {
			t.Errorf("%s: HTTP %d %s", p, code, body)
		}
	}
}

func TestRequestID(t *testing.T) {
	f := newFixture(t)
	url := f.gw + clusterv1connect.ClusterServiceListClustersProcedure
	seen := func(body string) string {
		var lr struct {
			Clusters []struct{ Labels map[string]string }
		}
		if err := json.Unmarshal([]byte(body), &lr); err != nil || len(lr.Clusters) == 0 {
			t.Fatalf("answer %q: %v", body, err)
		}
		return lr.Clusters[0].Labels["request-id"]
	}

	res, body := postJSON(t, url, adminToken, nil, strings.NewReader("{}"))
	gen := res.Header.Get(gateway.RequestIDHeader)
	if len(gen) != 36 || seen(body) != gen {
		t.Errorf("generated id: response %q, upstream %q", gen, seen(body))
	}

	res, body = postJSON(t, url, adminToken, map[string]string{gateway.RequestIDHeader: "client-id_1.2"}, strings.NewReader("{}"))
	if got := res.Header.Get(gateway.RequestIDHeader); got != "client-id_1.2" || seen(body) != "client-id_1.2" {
		t.Errorf("kept id: response %q, upstream %q", got, seen(body))
	}

	calls := f.clusters.calls.Load()
	for _, bad := range []string{"has space", strings.Repeat("a", 65), "semi;colon"} {
		res, body = postJSON(t, url, adminToken, map[string]string{gateway.RequestIDHeader: bad}, strings.NewReader("{}"))
		if res.StatusCode != http.StatusBadRequest || connectCode(t, body) != "invalid_argument" {
			t.Errorf("id %q: HTTP %d %s, want 400 invalid_argument", bad, res.StatusCode, body)
		}
		if got := res.Header.Get(gateway.RequestIDHeader); got == bad || got == "" {
			t.Errorf("id %q: the response carries %q, want a fresh id", bad, got)
		}
	}
	if f.clusters.calls.Load() != calls {
		t.Error("a call with an invalid request id reached the upstream")
	}
}

func TestReadyzFollowsUpstreams(t *testing.T) {
	f := newFixture(t)
	code, body := get(t, f.gw+"/readyz")
	if code != http.StatusOK || !strings.Contains(body, "[+] upstream "+f.projectsUp) {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	f.down.Store(true)
	waitFor(t, "gateway not ready", func() bool { c, _ := get(t, f.gw+"/readyz"); return c == http.StatusServiceUnavailable })
	_, body = get(t, f.gw+"/readyz")
	if !strings.Contains(body, "[-] upstream "+f.projectsUp) {
		t.Errorf("/readyz does not name the upstream: %s", body)
	}
	res, body := postJSON(t, f.gw+projectv1connect.ProjectServiceGetProjectProcedure, adminToken, nil, strings.NewReader(`{"name":"x"}`))
	if res.StatusCode != http.StatusServiceUnavailable || connectCode(t, body) != "unavailable" || !strings.Contains(body, f.projectsUp) {
		t.Errorf("call to a not-ready upstream: HTTP %d %s, want 503 unavailable naming it", res.StatusCode, body)
	}
	_, err := projectv1connect.NewProjectServiceClient(h2c(), f.gw, connect.WithGRPC()).GetProject(t.Context(), withToken(&projectv1.GetProjectRequest{Name: "x"}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("gRPC call to a not-ready upstream: %v, want unavailable", err)
	}
	// The other upstream still serves.
	if res, body := postJSON(t, f.gw+clusterv1connect.ClusterServiceListClustersProcedure, adminToken, nil, strings.NewReader("{}")); res.StatusCode != http.StatusOK {
		t.Errorf("ListClusters while another upstream is down: %d %s", res.StatusCode, body)
	}
	f.down.Store(false)
	waitFor(t, "gateway ready again", func() bool { c, _ := get(t, f.gw+"/readyz"); return c == http.StatusOK })

	// An upstream that is gone altogether: not ready, and calls are refused, not hung.
	f.stopProj()
	waitFor(t, "gateway not ready after the upstream stopped", func() bool { c, _ := get(t, f.gw+"/readyz"); return c == http.StatusServiceUnavailable })
	res, body = postJSON(t, f.gw+projectv1connect.ProjectServiceGetProjectProcedure, adminToken, nil, strings.NewReader(`{"name":"x"}`))
	if res.StatusCode != http.StatusServiceUnavailable || connectCode(t, body) != "unavailable" {
		t.Errorf("call to a stopped upstream: HTTP %d %s", res.StatusCode, body)
	}
}

func TestBodyLimit(t *testing.T) {
	f := newFixture(t)
	url := f.gw + clusterv1connect.ClusterServiceRegisterClusterProcedure
	big := fmt.Sprintf(`{"name":"c1","labels":{"x":%q}}`, strings.Repeat("a", maxBytes))
	res, body := postJSON(t, url, adminToken, nil, strings.NewReader(big))
	if res.StatusCode != http.StatusTooManyRequests || connectCode(t, body) != "resource_exhausted" {
		t.Errorf("oversized body: HTTP %d %s, want resource_exhausted", res.StatusCode, body)
	}
	// Without a length up front (chunked), the bound holds while the body streams.
	res, body = postJSON(t, url, adminToken, nil, io.MultiReader(strings.NewReader(big)))
	if res.StatusCode != http.StatusTooManyRequests || connectCode(t, body) != "resource_exhausted" {
		t.Errorf("oversized chunked body: HTTP %d %s, want resource_exhausted", res.StatusCode, body)
	}
	// A body shorter than its Content-Length (the client stopped sending): small unary bodies
	// are read whole before they are forwarded, so it is refused at the gateway.
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.gw, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{\"name\":", clusterv1connect.ClusterServiceRegisterClusterProcedure, adminToken)
	_ = conn.(*net.TCPConn).CloseWrite()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, _ := io.ReadAll(conn)
	// 499 (canceled) as net/http cancels the call when its client stops sending; 400 if not.
	if !bytes.HasPrefix(raw, []byte("HTTP/1.1 499")) && !bytes.HasPrefix(raw, []byte("HTTP/1.1 400")) {
		t.Errorf("truncated body: %q, want HTTP 499 or 400", raw)
	}
	if n := f.clusters.calls.Load(); n != 0 {
		t.Errorf("an oversized or truncated call reached the upstream handler %d times", n)
	}
	res, body = postJSON(t, url, adminToken, nil, bytes.NewReader([]byte(`{"name":"c1"}`)))
	if res.StatusCode != http.StatusOK || !strings.Contains(body, `"c1"`) {
		t.Errorf("small body: HTTP %d %s", res.StatusCode, body)
	}
}

func TestNewRejectsBadRoutes(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(adminToken+",admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := server.New(server.Config{TokenFile: tokens}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	for _, routes := range []map[string]string{
		nil,
		{"ClusterService": "http://a:8080"},
		{"fleetstream.cluster.v1.ClusterService": "https://a:8080"},
		{"fleetstream.cluster.v1.ClusterService": "http://a:8080/prefix"},
		{"fleetstream.cluster.v1.ClusterService": "a:8080"},
	} {
		if _, err := gateway.New(gateway.Config{Routes: routes}, s.Authenticator(), nil, zap.NewNop()); err == nil {
			t.Errorf("routes %v accepted", routes)
		}
	}
	if _, _, err := gateway.ParseRoute("fleetstream.cluster.v1.ClusterService"); err == nil {
		t.Error("a route without = accepted")
	}
}

// A unary answer above 2 KiB, which the service's net/http server sends chunked (connect-go
// gives it no length), reaches the client whole and with its length: the gateway reads it
// first rather than relaying it as a stream (a flush per chunk).
func TestLargeUnaryAnswerArrivesWithItsLength(t *testing.T) {
	f := newFixture(t)
	name := strings.Repeat("n", 3000)
	req, err := http.NewRequest(http.MethodPost, f.gw+clusterv1connect.ClusterServiceRegisterClusterProcedure,
		strings.NewReader(`{"name":"`+name+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	// No Accept-Encoding: the service would gzip an answer this large, and the client would
	// then hide the length it got.
	res, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("HTTP %d %.200s", res.StatusCode, body)
	}
	var answer struct{ Cluster struct{ Name string } }
	if err := json.Unmarshal(body, &answer); err != nil || answer.Cluster.Name != name {
		t.Fatalf("answer of %d bytes does not carry the name (%v)", len(body), err)
	}
	if res.ContentLength != int64(len(body)) || len(res.TransferEncoding) != 0 {
		t.Errorf("Content-Length %d, Transfer-Encoding %v for an answer of %d bytes: want its length", res.ContentLength, res.TransferEncoding, len(body))
	}
}

// The gateway serves the web console itself (no upstream holds it), with its security headers,
// and the console's API calls route like any other client's.
func TestGatewayServesTheConsole(t *testing.T) {
	f := newFixture(t)
	res, err := http.Get(f.gw + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `src="/ui/app.js"`) {
		t.Fatalf("GET /ui/: HTTP %d %.200s", res.StatusCode, body)
	}
	if got := res.Header.Get("Content-Security-Policy"); got != console.ContentSecurityPolicy {
		t.Errorf("CSP %q", got)
	}
	res, apiBody := postJSON(t, f.gw+clusterv1connect.ClusterServiceListClustersProcedure, adminToken, nil, strings.NewReader("{}"))
	if res.StatusCode != http.StatusOK {
		t.Errorf("the console's ListClusters through the gateway: HTTP %d %s", res.StatusCode, apiBody)
	}
}

// The gateway offers the console's OIDC sign-in like fleetd: /ui/config.json names the issuer's
// endpoints (discovered by the gateway with --oidc-ca-file), its --console-oidc-* settings, and
// the page's CSP lets it post to the issuer's token endpoint.
func TestGatewayConsoleOIDCConfig(t *testing.T) {
	is := oidctest.New(t)
	gs, err := server.New(server.Config{OIDC: server.OIDCConfig{IssuerURL: is.URL(), ClientID: "fleetstream", CAFile: is.CAFile}}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{
		Routes:  map[string]string{"fleetstream.cluster.v1.ClusterService": "http://127.0.0.1:1"},
		Console: console.Config{OIDCClientID: "fleetstream-console", OIDCRedirectURL: "https://fleet.example.com/ui/", OIDCScopes: "groups"},
	}, gs.Authenticator(), gs.Registry(), zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	gw.Mount(gs)
	base, _ := serve(t, gs)
	res, err := http.Get(base + "/ui/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if got, want := res.Header.Get("Content-Security-Policy"), console.CSP(is.URL()); got != want {
		t.Errorf("CSP %q, want %q", got, want)
	}
	res, err = http.Get(base + "/ui/config.json")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var got struct {
		OIDC map[string]string `json:"oidc"`
	}
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"issuer": is.URL(), "clientId": "fleetstream-console", "authorizationEndpoint": is.URL() + "/auth",
		"tokenEndpoint": is.URL() + "/token", "redirectUri": "https://fleet.example.com/ui/", "scope": "openid groups"}
	if fmt.Sprint(got.OIDC) != fmt.Sprint(want) {
		t.Errorf("config.json oidc %v, want %v", got.OIDC, want)
	}
}
