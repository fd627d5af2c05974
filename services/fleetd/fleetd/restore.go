package fleetd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/fleetstream/fleetstream/pkg/backup"
	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/version"
)

// RestoreConfig says which backup to restore into which data dir.
type RestoreConfig struct {
	// DataDir is the data dir of a stopped fleetd (or a new one).
	DataDir string
	// From is the backup directory (`fleetctl admin backup`).
	From string
	// Force replaces streams the data dir already holds.
	Force bool
	// Progress, when set, is called after each stream.
	Progress func(backup.Stream)
}

// Restore restores a backup into a fleetd data dir. A running fleetd creates its streams as it
// starts, so a restore cannot go through it: like rotate-credentials-key, Restore takes the data
// dir's lock (it fails while fleetd runs) and starts the embedded JetStream server on it,
// reachable in process only (loopback, random port, a token that lives in this process). The
// backup is verified whole before anything is written (backup.Restore). The credentials key is
// not in the backup and not needed here: fleetd needs it when it starts on the restored store.
func Restore(ctx context.Context, cfg RestoreConfig, log *zap.Logger) (*backup.Manifest, error) {
	if cfg.DataDir == "" || cfg.From == "" {
		return nil, errors.New("--data-dir and the backup directory are required")
	}
	// Refuse a damaged or newer backup before touching the data dir at all.
	if _, err := backup.Verify(cfg.From, version.Version); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer func() { _ = lock.Close() }()
	token, err := randomToken()
	if err != nil {
		return nil, err
	}
	ns, err := natsembed.Start(natsembed.Config{
		Name: "fleetd", StoreDir: filepath.Join(cfg.DataDir, "jetstream"), Port: -1, Logger: log.Named("nats"),
		Auth: tokenAuth(token),
	})
	if err != nil {
		return nil, fmt.Errorf("start the embedded server on %s: %w", cfg.DataDir, err)
	}
	defer ns.Stop()
	nc, err := nats.Connect("", nats.InProcessServer(ns), nats.Name("fleetd-restore"), nats.Token(token))
	if err != nil {
		return nil, fmt.Errorf("connect to the embedded server: %w", err)
	}
	defer nc.Close()
	opts := backup.RestoreOptions{Options: backup.Options{Version: version.Version}, Force: cfg.Force, Replicas: 1}
	if cfg.Progress != nil {
		opts.Progress = func(s backup.Stream, _ time.Duration) { cfg.Progress(s) }
	}
	return backup.Restore(ctx, nc, cfg.From, opts)
}
