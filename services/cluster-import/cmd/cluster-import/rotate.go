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
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/logging"
	"github.com/fleetstream/fleetstream/pkg/sealed"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// rotate reseals every stored credential value with the key file's first key, against the
// NATS cluster the service uses; the service may keep running (each value is replaced with
// compare-and-set).
func rotate(args []string) int {
	fs := flag.NewFlagSet("cluster-import rotate-credentials-key", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: cluster-import rotate-credentials-key --credentials-key-file FILE [flags]

Reseals every stored cluster credential value with the first key of FILE; FILE must still list
the keys that sealed the values. Run it after every cluster-import replica has been restarted
with FILE, then remove the old key lines. Prints counts and key ids, never values.

`)
		fs.PrintDefaults()
	}
	url := fs.String("nats-url", envOr("FLEETSTREAM_NATS_URL", nats.DefaultURL), "NATS server URLs, comma-separated")
	tokenFile := fs.String("nats-token-file", os.Getenv("FLEETSTREAM_NATS_TOKEN_FILE"), "file holding the NATS token")
	keyFile := fs.String("credentials-key-file", os.Getenv("FLEETSTREAM_CREDENTIALS_KEY_FILE"), keyFileUsage)
	newKey := fs.Bool("new-key", false, "first add a freshly generated key as the first line of the key file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *keyFile == "" || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	log, err := logging.New("warn", true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster-import:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "cluster-import rotate-credentials-key:", err)
		return 1
	}
	if *newKey {
		id, err := sealed.PrependNewKey(*keyFile, time.Now())
		if err != nil {
			return fail(err)
		}
		fmt.Printf("added key %s as the first line of %s\n", id, *keyFile)
	}
	ring, err := sealed.LoadKeyring(*keyFile)
	if err != nil {
		return fail(err)
	}
	connectCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nc, js, err := daemon.Connect(connectCtx, *url, *tokenFile, "cluster-import-rotate", log)
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	rep, err := clusterimport.Reseal(ctx, js, ring, log)
	fmt.Println(rep)
	if err != nil {
		return fail(err)
	}
	if old := ring.IDs()[1:]; len(old) > 0 {
		fmt.Printf("no stored value needs keys %s any more: remove them from the key file once every replica runs with key %s first\n",
			strings.Join(old, ", "), ring.ActiveID())
	}
	return 0
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
