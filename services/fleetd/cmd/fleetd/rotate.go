package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fleetstream/fleetstream/pkg/logging"
	"github.com/fleetstream/fleetstream/services/fleetd/fleetd"
)

const credentialsKeyFileUsage = "keys that seal cluster credentials at rest, one `key-id:base64-32-bytes` per line, the first seals (default <data-dir>/credentials.key, created on first start)"

// rotate runs `fleetd rotate-credentials-key`: against the data dir of a stopped fleetd.
func rotate(args []string) int {
	fs := flag.NewFlagSet("fleetd rotate-credentials-key", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: fleetd rotate-credentials-key --data-dir DIR [--new-key] [--credentials-key-file FILE]

Reseals every stored cluster credential value with the first key of the key file, which must
still list the keys that sealed them. Stop fleetd first: the command opens DIR itself. With
--new-key it first adds a fresh key as the file's first line. Afterwards the other key lines
can be deleted. Prints counts and key ids, never values.

`)
		fs.PrintDefaults()
	}
	var cfg fleetd.RotateConfig
	fs.StringVar(&cfg.DataDir, "data-dir", "", "fleetd's data dir (required)")
	fs.StringVar(&cfg.KeyFile, "credentials-key-file", "", credentialsKeyFileUsage)
	fs.BoolVar(&cfg.NewKey, "new-key", false, "first add a freshly generated key as the first line of the key file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfg.DataDir == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	log, err := logging.New("warn", true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetd:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := fleetd.RotateCredentialsKey(ctx, cfg, log)
	if res != nil && res.AddedKeyID != "" {
		fmt.Printf("added key %s as the first line of %s\n", res.AddedKeyID, res.KeyFile)
	}
	if res != nil && res.Report.ActiveKeyID != "" {
		fmt.Println(res.Report)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleetd rotate-credentials-key:", err)
		return 1
	}
	if len(res.OldKeyIDs) > 0 {
		fmt.Printf("no stored value needs keys %s any more: you may delete their lines from %s\n", strings.Join(res.OldKeyIDs, ", "), res.KeyFile)
	}
	return 0
}
