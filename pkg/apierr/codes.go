package apierr

import (
	"fmt"

	"connectrpc.com/connect"
)

// The answers every service gives in the same situations, defined once so that their codes and
// words agree across services (clients match on codes; people read the words).

// Starting says that component has not caught up with its streams yet: retry shortly.
func Starting(component string) error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s is starting", component))
}

// NotYetVisible says that a change was stored but the service's view did not show it within
// the request's patience (read-your-writes): the change stands; a read shortly after sees it.
func NotYetVisible(what string, err error) error {
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s accepted but not yet visible: %w", what, err))
}

// RevisionMismatch refuses a conditional write: the object is at revision have, the caller
// expected want.
func RevisionMismatch(kind, name string, have, want uint64) error {
	return connect.NewError(connect.CodeAborted, fmt.Errorf("%s %q is at revision %d, not %d", kind, name, have, want))
}

// Concurrent says that what the call changes was changed by someone else meanwhile: read it
// again and retry. format describes what changed ("cluster set %q", ...).
func Concurrent(format string, args ...any) error {
	return connect.NewError(connect.CodeAborted, fmt.Errorf(format+" changed concurrently; read it again", args...))
}

// Aborted refuses a call that lost a race or met a busy resource; retrying may succeed.
func Aborted(format string, args ...any) error {
	return connect.NewError(connect.CodeAborted, fmt.Errorf(format, args...))
}

// WatchFellBehind ends a watch whose receiver could not keep up: watch again (a new watch starts
// with the current state).
func WatchFellBehind(what string) error {
	return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("watch of %s fell behind; watch again", what))
}

// NotFoundf says that what the message names does not exist (when NotFound's "kind name" does
// not fit).
func NotFoundf(format string, args ...any) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf(format, args...))
}

// AlreadyExistsf says that what the message names exists already.
func AlreadyExistsf(format string, args ...any) error {
	return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf(format, args...))
}

// PermissionDenied refuses an authenticated caller.
func PermissionDenied(format string, args ...any) error {
	return connect.NewError(connect.CodePermissionDenied, fmt.Errorf(format, args...))
}

// Unauthenticated refuses a caller whose credentials are missing, invalid or expired. err says
// which, never the credential itself.
func Unauthenticated(err error) error {
	return connect.NewError(connect.CodeUnauthenticated, err)
}

// Unavailable says that something the call needs is down or not ready: retry later.
func Unavailable(err error) error {
	return connect.NewError(connect.CodeUnavailable, err)
}

// Unavailablef is Unavailable with a message.
func Unavailablef(format string, args ...any) error {
	return Unavailable(fmt.Errorf(format, args...))
}
