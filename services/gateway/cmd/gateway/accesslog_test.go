package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

// syncBuffer is a bytes.Buffer safe for the flusher goroutine and the test, counting writes.
type syncBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Access-log lines wait in the buffer and then reach the stream whole, in order, in few
// writes: flushed every interval while the gateway runs, and once more when it stops.
func TestAccessLogIsBufferedAndFlushed(t *testing.T) {
	out := &syncBuffer{}
	log, buf, err := newAccessLog("info", false, out)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); buf.run(ctx, 50*time.Millisecond) }()

	for i := range 100 {
		log.Info("request", zap.Int("n", i))
	}
	log.Debug("below the level")
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(out.String(), "\n") < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s, %d of 100 lines written", strings.Count(out.String(), "\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	out.mu.Lock()
	writes := out.writes
	out.mu.Unlock()
	if writes > 10 {
		t.Errorf("100 lines took %d writes: not buffered", writes)
	}

	log.Info("request", zap.Int("n", 100))
	cancel()
	<-done
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 101 {
		t.Fatalf("%d lines after the stop, want 101 (the last flushed at exit)", len(lines))
	}
	for i, l := range lines {
		var e struct {
			Msg string `json:"msg"`
			N   int    `json:"n"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Msg != "request" || e.N != i {
			t.Fatalf("line %d: %q (%v): not the %dth access-log line, whole", i, l, err, i)
		}
	}
}

// Lines of another logger on the same stream land between buffered lines, never inside one,
// and a line larger than the buffer is written at once, after what waited.
func TestLineBufferWritesWholeLines(t *testing.T) {
	out := &syncBuffer{}
	lb := &lineBuffer{w: out, size: 50}
	write := func(s string) {
		if _, err := lb.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	write("a1234567890123456789\n")
	write("b1234567890123456789\n")
	_, _ = out.Write([]byte("other\n")) // another logger, unbuffered
	write("c1234567890123456789\n")     // does not fit with a and b: they go first, whole
	write(strings.Repeat("d", 80) + "\n")
	if err := lb.Sync(); err != nil {
		t.Fatal(err)
	}
	want := "other\na1234567890123456789\nb1234567890123456789\nc1234567890123456789\n" + strings.Repeat("d", 80) + "\n"
	if got := out.String(); got != want {
		t.Errorf("stream:\n%s\nwant:\n%s", got, want)
	}
}
