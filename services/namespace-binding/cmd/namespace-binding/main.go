// Command namespace-binding will run the namespace-binding service (see ../shared/spec). Until its issue lands it only
// joins the stack: it connects to NATS and reports healthy and ready, so the deployment is
// complete and checked end to end.
package main

import (
	"context"
	"os"

	"github.com/fleetstream/fleetstream/pkg/daemon"
)

func main() {
	os.Exit(daemon.Main("namespace-binding", os.Args[1:], nil, func(context.Context, *daemon.Env) error { return nil }))
}
