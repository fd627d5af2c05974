// Package apierr turns validation failures and store errors into Connect errors with the codes
// and field paths API callers rely on. Nothing reaches a caller as a bare internal error.
package apierr

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleetstream/fleetstream/pkg/events"
)

// Violations collects every problem with a request, each with the field path it concerns.
type Violations struct {
	list []*errdetails.BadRequest_FieldViolation
}

// Add records a problem with field.
func (v *Violations) Add(field, format string, args ...any) {
	v.list = append(v.list, &errdetails.BadRequest_FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
}

// Empty reports whether nothing was recorded.
func (v *Violations) Empty() bool { return len(v.list) == 0 }

// Err returns nil, or an InvalidArgument error whose message names each field and which
// carries a google.rpc.BadRequest detail for programs.
func (v *Violations) Err() error {
	if len(v.list) == 0 {
		return nil
	}
	msgs := make([]string, len(v.list))
	for i, f := range v.list {
		msgs[i] = f.Field + ": " + f.Description
	}
	ce := connect.NewError(connect.CodeInvalidArgument, errors.New(strings.Join(msgs, "; ")))
	if d, err := connect.NewErrorDetail(&errdetails.BadRequest{FieldViolations: v.list}); err == nil {
		ce.AddDetail(d)
	}
	return ce
}

// DNSLabel checks that value is an RFC 1123 label (what Kubernetes requires of namespace names).
func (v *Violations) DNSLabel(field, value string) {
	if value == "" {
		v.Add(field, "required")
		return
	}
	for _, msg := range validation.IsDNS1123Label(value) {
		v.Add(field, "%q: %s", value, msg)
	}
}

// Labels checks Kubernetes label syntax for every key and value.
func (v *Violations) Labels(field string, labels map[string]string) {
	for k, val := range labels {
		for _, msg := range validation.IsQualifiedName(k) {
			v.Add(fmt.Sprintf("%s[%q]", field, k), "key: %s", msg)
		}
		for _, msg := range validation.IsValidLabelValue(val) {
			v.Add(fmt.Sprintf("%s[%q]", field, k), "value %q: %s", val, msg)
		}
	}
}

// NotFound says that kind name does not exist.
func NotFound(kind, name string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s %q not found", kind, name))
}

// AlreadyExists says that kind name exists.
func AlreadyExists(kind, name string) error {
	return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s %q already exists", kind, name))
}

// FailedPrecondition wraps a refusal due to the current state.
func FailedPrecondition(format string, args ...any) error {
	return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(format, args...))
}

// Internal maps an error from the store or the bus: a lost optimistic-concurrency race is
// Aborted (retry with a fresh read), a deadline is DeadlineExceeded, anything else Unavailable
// (the bus is down or electing a leader; the call can be retried).
func Internal(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return err
	case events.IsConflict(err):
		return connect.NewError(connect.CodeAborted, fmt.Errorf("concurrent modification, read again and retry: %w", err))
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	}
	return connect.NewError(connect.CodeUnavailable, err)
}
