package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/apierr"
)

// lateInterceptor delegates to the interceptor Server.Authorize installs, resolved per call:
// handlers are built (and their interceptor chains fixed) when services mount, which may be
// before the process has the NATS connection the authorizer reads through.
type lateInterceptor struct{ s *Server }

var errNoAuthorizer = errors.New("authorization is not configured on this server")

func (l lateInterceptor) current() connect.Interceptor {
	if p := l.s.authz.Load(); p != nil {
		return *p
	}
	return nil
}

func (l lateInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		i := l.current()
		if i == nil {
			return nil, apierr.Unavailable(errNoAuthorizer)
		}
		return i.WrapUnary(next)(ctx, req)
	}
}

func (l lateInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (l lateInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		i := l.current()
		if i == nil {
			return apierr.Unavailable(errNoAuthorizer)
		}
		return i.WrapStreamingHandler(next)(ctx, conn)
	}
}
