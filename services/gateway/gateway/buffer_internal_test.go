package gateway

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// An answer without a length is read whole into the buffer when it fits, and given its length;
// a longer one reaches the reader complete, the part read first and then the rest.
func TestBufferUnaryAnswer(t *testing.T) {
	for _, size := range []int{0, 1, 3000, copyBufferSize, copyBufferSize + 1, 5 * copyBufferSize} {
		want := bytes.Repeat([]byte("0123456789abcdef"), size/16+1)[:size]
		closed := false
		res := &http.Response{
			ContentLength:    -1,
			TransferEncoding: []string{"chunked"},
			Header:           http.Header{},
			Body:             &closeRecorder{Reader: bytes.NewReader(want), closed: &closed},
		}
		if err := bufferUnaryAnswer(res); err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		whole := size < copyBufferSize
		if whole != closed {
			t.Errorf("%d bytes: upstream body closed %v before the answer was relayed, want %v", size, closed, whole)
		}
		if whole && (res.ContentLength != int64(size) || res.Header.Get("Content-Length") == "" || res.TransferEncoding != nil) {
			t.Errorf("%d bytes: length %d (header %q, transfer encoding %v), want its length", size, res.ContentLength, res.Header.Get("Content-Length"), res.TransferEncoding)
		}
		if !whole && res.ContentLength != -1 {
			t.Errorf("%d bytes: length %d, want -1 (streamed)", size, res.ContentLength)
		}
		got, err := io.ReadAll(res.Body)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%d bytes: read %d bytes (%v), not the answer", size, len(got), err)
		}
		if err := res.Body.Close(); err != nil || !closed {
			t.Errorf("%d bytes: Close: %v, upstream body closed %v", size, err, closed)
		}
	}
}

type closeRecorder struct {
	io.Reader
	closed *bool
}

func (c *closeRecorder) Close() error { *c.closed = true; return nil }
