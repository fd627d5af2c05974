// Command access-audit keeps an append-only audit log (JSON lines) of who was granted what where
// and when, from Fleetstream's events. See ../../README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/examples/access-audit/audit"
	"github.com/fleetstream/fleetstream/pkg/subscribe"
)

func main() {
	var cfg subscribe.Config
	var tokenFile, out string
	flag.StringVar(&cfg.URL, "nats-url", "nats://127.0.0.1:4222", "NATS server URLs")
	flag.StringVar(&cfg.Name, "subscriber", "access-audit", "the subscriber's name")
	flag.StringVar(&tokenFile, "subscriber-token-file", "", "file holding the subscriber's NATS token")
	flag.StringVar(&out, "out", "access-audit.jsonl", "the audit log, appended to")
	flag.Uint64Var(&cfg.FromSequence, "from-seq", 1, "where a new subscriber starts (1: the beginning)")
	flag.Parse()
	if err := run(cfg, tokenFile, out); err != nil {
		fmt.Fprintln(os.Stderr, "access-audit:", err)
		os.Exit(1)
	}
}

func run(cfg subscribe.Config, tokenFile, out string) error {
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("read the subscriber token: %w", err)
	}
	cfg.Token = strings.TrimSpace(string(tok))
	f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", out, err)
	}
	defer f.Close()
	log, err := zap.NewProduction()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return audit.Run(ctx, cfg, f, log)
}
