package testkit

import (
	"fmt"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// Logs is what a component logged, at every level, for tests that wait for something the
// component only reports in its log (a failed attempt it will retry).
type Logs struct{ *observer.ObservedLogs }

// ObservedLogger returns a logger like Logger that also records every entry, debug included.
func ObservedLogger(t testing.TB) (*zap.Logger, *Logs) {
	core, logs := observer.New(zapcore.DebugLevel)
	return zap.New(zapcore.NewTee(Logger(t).Core(), core)), &Logs{logs}
}

// Count returns a condition for Eventually: at least n entries whose message contains msg.
func (l *Logs) Count(msg string, n int) func() error {
	return func() error {
		if got := l.FilterMessageSnippet(msg).Len(); got < n {
			return fmt.Errorf("%d log entries %q, want %d", got, msg, n)
		}
		return nil
	}
}
