// Command rbac-sync will run the rbac-sync service (see ../shared/spec). Until its issue lands it only
// joins the stack: it connects to NATS and reports healthy and ready, so the deployment is
// complete and checked end to end.
package main

import (
	"context"
	"os"

	"github.com/fleetstream/fleetstream/pkg/daemon"
)

func main() {
	os.Exit(daemon.Main("rbac-sync", os.Args[1:], nil, func(context.Context, *daemon.Env) error { return nil }))
}
