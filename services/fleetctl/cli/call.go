package cli

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
)

// Every fleetctl command that talks to the API has one skeleton: build a client from the global
// flags, bound the request by --timeout, say which request failed, print the answer. call (one
// request) and watch (a server stream) hold that skeleton, so a command states only what is its
// own: the method, the request, the words of its error and how the answer is printed. Like
// kubectl's resource.Builder, they take the generated client constructor rather than a client,
// so a new service needs no change here.

// clientConstructor is a generated Connect client constructor, such as
// clusterv1connect.NewClusterServiceClient.
type clientConstructor[C any] func(connect.HTTPClient, string, ...connect.ClientOption) C

// call sends req through method, a method expression of the client newC builds (e.g.
// clusterv1connect.ClusterServiceClient.GetCluster), bounded by --timeout, and returns the
// response message. A failed call is wrapped as "<what>: <error>"; PrintError still shows an
// API error's code and message as the server sent them. An error building the client (a bad
// --server, an unreadable token file) is returned as is: it concerns no one request.
func call[C, Req, Resp any](ctx context.Context, f *factory, newC clientConstructor[C],
	method func(C, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	req *Req, what string, args ...any) (*Resp, error) {
	client, err := newClient(f, newC)
	if err != nil {
		return nil, err
	}
	ctx, cancel := f.requestContext(ctx)
	defer cancel()
	resp, err := method(client, ctx, connect.NewRequest(req))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", fmt.Sprintf(what, args...), err)
	}
	return resp.Msg, nil
}

// watch opens a server stream through method and prints each message with out until the user
// interrupts it or a given --timeout runs out, both of which end it successfully. A failure is
// wrapped as "<what>: <error>"; the server ending the stream is the error closed, since a user
// reading the output must learn that the watch stopped.
func watch[C, Req, Resp any](ctx context.Context, f *factory, newC clientConstructor[C],
	method func(C, context.Context, *connect.Request[Req]) (*connect.ServerStreamForClient[Resp], error),
	req *Req, out *StreamPrinter, closed string, what string, args ...any) error {
	client, err := newClient(f, newC)
	if err != nil {
		return err
	}
	ctx, cancel := f.watchContext(ctx)
	defer cancel()
	_, bounded := ctx.Deadline()
	// ended tells the end the user asked for from a failure. Connect sends the server the
	// deadline, so the server may enforce --timeout a moment before the client does and answer
	// deadline_exceeded while ctx is still live; and a server with nothing to send yet may not
	// have answered the request when the time runs out.
	ended := func(err error) bool {
		return ctx.Err() != nil || bounded && connect.CodeOf(err) == connect.CodeDeadlineExceeded
	}
	stream, err := method(client, ctx, connect.NewRequest(req))
	if err != nil {
		if ended(err) {
			return nil
		}
		return fmt.Errorf("%s: %w", fmt.Sprintf(what, args...), err)
	}
	defer stream.Close()
	for stream.Receive() {
		// Every generated message is a proto.Message; Resp cannot say so without a second
		// type parameter that would defeat inference at every call site.
		if err := out.Print(any(stream.Msg()).(proto.Message)); err != nil {
			return err
		}
	}
	err = stream.Err()
	if err != nil && ended(err) {
		return nil
	}
	if err == nil {
		return errors.New(closed)
	}
	return fmt.Errorf("%s: %w", fmt.Sprintf(what, args...), err)
}
