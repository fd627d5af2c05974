// Command fleetctl is the command-line client of the Fleetstream control plane APIs.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetstream/fleetstream/services/fleetctl/cli"
)

func main() {
	// Interrupting ends a running watch cleanly instead of killing the process mid-write.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, cli.StdStreams(), os.Args[1:])
	stop()
	os.Exit(code)
}
