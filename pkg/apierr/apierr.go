// Package apierr turns validation failures and store errors into Connect errors with the codes
// and field paths API callers rely on. Nothing reaches a caller as a bare internal error.
package apierr

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleetstream/fleetstream/pkg/events"
)

// Violations collects the problems with a request, each with the field path it concerns. It
// keeps the first MaxViolations and counts the rest, so a request with a million bad entries
// gets an answer of a few lines.
type Violations struct {
	list    []*errdetails.BadRequest_FieldViolation
	dropped int
}

// MaxViolations is how many problems an error lists.
const MaxViolations = 20

// Add records a problem with field.
func (v *Violations) Add(field, format string, args ...any) {
	if len(v.list) >= MaxViolations {
		v.dropped++
		return
	}
	v.list = append(v.list, &errdetails.BadRequest_FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
}

// Empty reports whether nothing was recorded.
func (v *Violations) Empty() bool { return len(v.list) == 0 }

// maxShown is how much of a rejected value an error message quotes.
const maxShown = 64

// Short quotes s for an error message, cut to its first bytes when long: errors name what was
// wrong without echoing a large (or secret-bearing) input back.
func Short(s string) string {
	if len(s) <= maxShown {
		return strconv.Quote(s)
	}
	cut := maxShown
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// Size limits of the maps and lists a stored object carries (Kubernetes' own limits are the
// guide: a label value is at most 63 bytes, all annotations of an object at most 256 KiB).
const (
	MaxLabels     = 100
	MaxLabelBytes = 16 << 10
	MaxClaims     = 100
	MaxClaimBytes = 64 << 10
	MaxTaints     = 50
)

// Limit checks that m has at most maxEntries entries of at most maxBytes in all.
func (v *Violations) Limit(field string, m map[string]string, maxEntries, maxBytes int) {
	if len(m) > maxEntries {
		v.Add(field, "%d entries, at most %d allowed", len(m), maxEntries)
		return
	}
	size := 0
	for k, val := range m {
		size += len(k) + len(val)
	}
	if size > maxBytes {
		v.Add(field, "%d bytes in all, at most %d allowed", size, maxBytes)
	}
}

// Err returns nil, or an InvalidArgument error whose message names each field and which
// carries a google.rpc.BadRequest detail for programs.
func (v *Violations) Err() error {
	if len(v.list) == 0 {
		return nil
	}
	msgs := make([]string, len(v.list), len(v.list)+1)
	for i, f := range v.list {
		msgs[i] = f.Field + ": " + f.Description
	}
	if v.dropped > 0 {
		msgs = append(msgs, fmt.Sprintf("and %d more problems", v.dropped))
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
		v.Add(field, "%s: %s", Short(value), msg)
	}
}

// Labels checks Kubernetes label syntax for every key and value.
func (v *Violations) Labels(field string, labels map[string]string) {
	v.Limit(field, labels, MaxLabels, MaxLabelBytes)
	for k, val := range labels {
		for _, msg := range validation.IsQualifiedName(k) {
			v.Add(fmt.Sprintf("%s[%s]", field, Short(k)), "key: %s", msg)
		}
		for _, msg := range validation.IsValidLabelValue(val) {
			v.Add(fmt.Sprintf("%s[%s]", field, Short(k)), "value %s: %s", Short(val), msg)
		}
	}
}

// Selector parses a Kubernetes label selector ("" selects everything). A bad one is a violation
// of field, and the result is nil then.
func (v *Violations) Selector(field, s string) labels.Selector {
	sel, err := labels.Parse(s)
	if err != nil {
		v.Add(field, "%v", err)
		return nil
	}
	return sel
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
// Aborted (retry with a fresh read), a deadline is DeadlineExceeded, the bus being unreachable
// or without a stream leader Unavailable (retry later), and anything else Internal: a bug or
// corrupt data, which a client retrying would only repeat.
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
	case transient(err):
		return connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// transient reports the bus errors after which the same call may succeed.
func transient(err error) bool { return events.Transient(err) }
