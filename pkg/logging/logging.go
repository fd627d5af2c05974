// Package logging builds the zap logger every binary uses: JSON in production, console for a
// terminal, level from a flag.
package logging

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New returns a logger at level ("debug", "info", "warn", "error"); development selects a
// human-readable console encoder.
func New(level string, development bool) (*zap.Logger, error) {
	cfg, err := Config(level, development)
	if err != nil {
		return nil, err
	}
	return cfg.Build()
}

// Config is the configuration New builds, writing to stderr.
//
// Sampling is off: zap's production default keeps the first 100 entries with one message in a
// second and then one in 100, and every access-log line has the same message, so above 100
// requests a second most requests were never logged. Volume is chosen with the level instead.
func Config(level string, development bool) (zap.Config, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return zap.Config{}, fmt.Errorf("log level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	if development {
		cfg = zap.NewDevelopmentConfig()
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.DisableStacktrace = !development
	cfg.Sampling = nil
	return cfg, nil
}
