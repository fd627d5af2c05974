package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetstream/fleetstream/pkg/backup"
	"github.com/fleetstream/fleetstream/pkg/logging"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

// restore runs `fleetd restore`: a backup into the data dir of a stopped (or new) fleetd.
func restore(args []string) int {
	fs := flag.NewFlagSet("fleetd restore", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: fleetd restore --data-dir DIR [--force] BACKUP

Restores every stream of BACKUP (written by fleetctl admin backup) into fleetd's data dir DIR.
Stop fleetd first: the command opens DIR itself. The backup is verified whole first (checksums,
archives, version); a damaged or newer backup, or a data dir already holding any of its streams
(without --force), restores nothing. Start fleetd on DIR afterwards with the credentials key of
the backed-up fleetd (--credentials-key-file, or its credentials.key copied into DIR): the key is
not in the backup, and sealed cluster credentials open only with it. Views rebuild from the
restored streams as fleetd starts.

`)
		fs.PrintDefaults()
	}
	var cfg fleetd.RestoreConfig
	fs.StringVar(&cfg.DataDir, "data-dir", "", "fleetd's data dir (required; created if missing)")
	fs.BoolVar(&cfg.Force, "force", false, "replace streams the data dir already holds")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfg.DataDir == "" || fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	cfg.From = fs.Arg(0)
	cfg.Progress = func(s backup.Stream) {
		fmt.Printf("restored %s: %d messages up to sequence %d\n", s.Name, s.Msgs, s.LastSeq)
	}
	log, err := logging.New("warn", true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetd:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m, err := fleetd.Restore(ctx, cfg, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetd restore:", err)
		return 1
	}
	fmt.Printf("restored %d streams of the backup written by Fleetstream %s at %s\n", len(m.Streams), m.FleetstreamVersion, m.Started.Format("2006-01-02T15:04:05Z"))
	return 0
}
