package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1/auditv1connect"
	"github.com/fleetstream/fleetstream/pkg/server"
)

// fakeToken is the bearer token fakeAPI accepts.
const fakeToken = "fake-t0ken"

// fakeAPI serves every method fleetctl calls with canned answers and records what it was sent,
// so a command's flags (what reaches the server) and its output (what it makes of the answer)
// are tested in milliseconds, without the real services the end-to-end tests run. What the
// services do is their own tests' business; here the server is only as real as the wire.
type fakeAPI struct {
	url string

	mu sync.Mutex
	// answers holds the responses of a test: a unary method answers with the first of its
	// response type (an empty one when there is none), a stream sends all of its type.
	answers []proto.Message
	// err, when set, is every method's answer.
	err error
	// hold keeps a stream open after its answers until the client goes away; otherwise the
	// server ends it, which a watch reports.
	hold bool
	// requests are what the methods were sent, in order.
	requests []fakeRequest
	// strict refuses a JSON request's unknown field, as the hub has since 81c7666.
	strict bool
}

type fakeRequest struct {
	procedure   string
	contentType string // how it was encoded: application/proto, application/json, ...
	msg         proto.Message
}

// startFakeAPI serves as today's hub decodes: a JSON request's unknown field is refused
// (invalid_argument naming it), binary keeps it.
func startFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	return startFakeAPIWith(t, true)
}

// startOldFakeAPI serves as a hub from before strict decoding: Connect's own JSON codec drops
// an unknown field, so a dry_run it does not know would be read as a write.
func startOldFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	return startFakeAPIWith(t, false)
}

// strictJSON is the hub's JSON decoding (pkg/server) for the fake's dynamic messages.
type strictJSON struct{ name string }

func (c strictJSON) Name() string { return c.name }

func (strictJSON) Marshal(m any) ([]byte, error) { return protojson.Marshal(m.(proto.Message)) }

func (strictJSON) Unmarshal(data []byte, m any) error {
	return server.UnmarshalJSON(data, m.(proto.Message))
}

func startFakeAPIWith(t *testing.T, strict bool) *fakeAPI {
	t.Helper()
	a := &fakeAPI{strict: strict}
	mux := http.NewServeMux()
	// Every method of every fleetstream service linked into this binary (fleetctl's commands
	// link the clients of all they call) is served from its descriptor, so a new RPC needs no
	// line here: a command calling it gets its answers like any other.
	methods := 0
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "fleetstream.") {
			return true
		}
		for i := range fd.Services().Len() {
			sd := fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				a.serve(t, mux, sd.Methods().Get(j))
				methods++
			}
		}
		return true
	})
	if methods == 0 {
		t.Fatal("fakeAPI found no fleetstream service to serve")
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

// pagedProcedures answer as fakePaged says; every other unary method answers with the first
// answer of its response type.
var pagedProcedures = map[string]bool{auditv1connect.AuditServiceListActivityProcedure: true}

// serve registers md on mux: a unary method answers with the first answer of its response type
// (the calls-th for a paged one), a server stream sends all of them.
func (a *fakeAPI) serve(t *testing.T, mux *http.ServeMux, md protoreflect.MethodDescriptor) {
	t.Helper()
	procedure := "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
	in, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	if err != nil {
		t.Fatalf("%s: %v", procedure, err)
	}
	opts := []connect.HandlerOption{connect.WithSchema(md), connect.WithRequestInitializer(
		func(_ connect.Spec, msg any) error {
			*msg.(*dynamicpb.Message) = *dynamicpb.NewMessage(md.Input())
			return nil
		})}
	if a.strict {
		opts = append(opts, connect.WithCodec(strictJSON{name: "json"}), connect.WithCodec(strictJSON{name: "json; charset=utf-8"}))
	}
	// received records a request as the generated type it is, so golden files print it as the
	// real server would have read it.
	received := func(req *connect.Request[dynamicpb.Message]) error {
		msg := in.New().Interface()
		if err := convert(req.Msg, msg); err != nil {
			return connect.NewError(connect.CodeInternal, err)
		}
		return a.receive(procedure, req.Header(), msg)
	}
	switch {
	case md.IsStreamingClient():
		t.Fatalf("%s: fakeAPI serves no client stream", procedure)
	case md.IsStreamingServer():
		mux.Handle(procedure, connect.NewServerStreamHandler(procedure, func(ctx context.Context, req *connect.Request[dynamicpb.Message], stream *connect.ServerStream[dynamicpb.Message]) error {
			if err := received(req); err != nil {
				return err
			}
			for _, m := range a.answersOf(md.Output()) {
				if err := stream.Send(m); err != nil {
					return err
				}
			}
			a.mu.Lock()
			hold := a.hold
			a.mu.Unlock()
			if hold {
				// An error rather than a clean end: ended cleanly, the stream would read as
				// the server closing it should the client see the end before its own deadline.
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}, opts...))
	default:
		mux.Handle(procedure, connect.NewUnaryHandler(procedure, func(_ context.Context, req *connect.Request[dynamicpb.Message]) (*connect.Response[dynamicpb.Message], error) {
			if err := received(req); err != nil {
				return nil, err
			}
			answers := a.answersOf(md.Output())
			switch {
			case len(answers) == 0:
				return connect.NewResponse(dynamicpb.NewMessage(md.Output())), nil
			case pagedProcedures[procedure]:
				// The n-th call of the procedure gets the n-th answer (the last one once they
				// run out), so a command reading page after page is shown.
				return connect.NewResponse(answers[min(a.calls(procedure), len(answers))-1]), nil
			default:
				return connect.NewResponse(answers[0]), nil
			}
		}, opts...))
	}
}

// convert copies from into to, messages of the same type (one dynamic, one generated).
func convert(from, to proto.Message) error {
	data, err := proto.Marshal(from)
	if err != nil {
		return err
	}
	return proto.Unmarshal(data, to)
}

// reset sets the answers of the next command and forgets what was sent.
func (a *fakeAPI) reset(answers []proto.Message, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answers, a.err, a.requests, a.hold = answers, err, nil, false
}

// holdStreams sets whether streams stay open after their answers.
func (a *fakeAPI) holdStreams(hold bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hold = hold
}

// sent returns the requests since the last reset.
func (a *fakeAPI) sent() []fakeRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]fakeRequest(nil), a.requests...)
}

// receive records a request and checks its token, as the real server's authentication does.
func (a *fakeAPI) receive(procedure string, h http.Header, msg proto.Message) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests = append(a.requests, fakeRequest{procedure: procedure, contentType: h.Get("Content-Type"), msg: msg})
	if h.Get("Authorization") != "Bearer "+fakeToken {
		return connect.NewError(connect.CodeUnauthenticated, nil)
	}
	return a.err
}

// answersOf returns the answers of type out, as messages of that type's descriptor.
func (a *fakeAPI) answersOf(out protoreflect.MessageDescriptor) []*dynamicpb.Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	var msgs []*dynamicpb.Message
	for _, m := range a.answers {
		if m.ProtoReflect().Descriptor().FullName() == out.FullName() {
			d := dynamicpb.NewMessage(out)
			if err := convert(m, d); err != nil {
				panic(fmt.Sprintf("answer %s: %v", out.FullName(), err)) // a test's own message
			}
			msgs = append(msgs, d)
		}
	}
	return msgs
}

// calls returns how many requests procedure received since the last reset.
func (a *fakeAPI) calls(procedure string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, r := range a.requests {
		if r.procedure == procedure {
			n++
		}
	}
	return n
}

// canonicalJSON renders a request for a golden file. protojson varies its whitespace on
// purpose; compacting and indenting makes it stable.
func canonicalJSON(t *testing.T, m proto.Message) string {
	t.Helper()
	data, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		t.Fatal(err)
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		t.Fatal(err)
	}
	return out.String()
}
