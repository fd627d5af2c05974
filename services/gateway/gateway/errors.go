package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"connectrpc.com/connect"
)

// The codes the gateway itself answers with.
const (
	codeCanceled          = connect.CodeCanceled
	codeInvalidArgument   = connect.CodeInvalidArgument
	codeUnimplemented     = connect.CodeUnimplemented
	codeUnavailable       = connect.CodeUnavailable
	codeResourceExhausted = connect.CodeResourceExhausted
)

// httpStatus is the Connect protocol's HTTP status of a code
// (https://connectrpc.com/docs/protocol#error-codes); connect-go does not export its table.
func httpStatus(c connect.Code) int {
	switch c {
	case connect.CodeCanceled:
		return 499
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeNotFound, connect.CodeUnimplemented:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeFailedPrecondition:
		return http.StatusPreconditionFailed
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// writeConnectError answers with err's code and message (a *connect.Error from the
// authenticator; anything else is an internal error whose text is not shown).
func writeConnectError(w http.ResponseWriter, r *http.Request, err error) {
	var ce *connect.Error
	if errors.As(err, &ce) {
		writeError(w, r, ce.Code(), ce.Message())
		return
	}
	writeError(w, r, connect.CodeInternal, "internal error")
}

// writeError answers a call the gateway refuses itself, in the caller's protocol: gRPC and
// gRPC-Web callers get a trailers-only response (HTTP 200 with grpc-status and grpc-message in
// the headers), so their clients see the code; everyone else gets the Connect JSON error
// ({"code": "...", "message": "..."}) with the code's HTTP status, which Connect clients of
// either unary or streaming calls map back to the code.
func writeError(w http.ResponseWriter, r *http.Request, code connect.Code, msg string) {
	h := w.Header()
	if ct := r.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/grpc") {
		h.Set("Content-Type", ct)
		h.Set("Grpc-Status", strconv.Itoa(int(code)))
		h.Set("Grpc-Message", grpcPercentEncode(msg))
		w.WriteHeader(http.StatusOK)
		return
	}
	body, err := json.Marshal(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code.String(), msg})
	if err != nil {
		// Two strings always marshal; keep the code even if that ever changed.
		body = []byte(`{"code":"` + code.String() + `"}`)
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(httpStatus(code))
	_, _ = w.Write(body)
}

// grpcPercentEncode encodes a grpc-message value: printable ASCII except % as is, every other
// byte as %XX (the gRPC over HTTP/2 spec).
func grpcPercentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c <= 0x7e && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteString("%" + strings.ToUpper(strconv.FormatUint(uint64(c)>>4, 16)+strconv.FormatUint(uint64(c)&0xf, 16)))
	}
	return b.String()
}
