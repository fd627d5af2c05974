// Package apiwait is how an API handler waits on its service's state, the same way in every hub
// service: for the service to have caught up with its streams before it answers at all, and
// for a write it just made to be visible in the view it reads from (read-your-writes), each
// bounded by Patience and answered with the shared apierr codes when it runs out.
package apiwait

import (
	"context"
	"time"

	"github.com/fleetstream/fleetstream/pkg/apierr"
)

// Patience bounds each wait: past it a caller is better served by a retryable error than by a
// hanging call.
const Patience = 10 * time.Second

// Ready returns nil once ready is closed, or apierr.Starting(component) when ctx ends or
// Patience runs out first.
func Ready(ctx context.Context, ready <-chan struct{}, component string) error {
	// A ready service answers even a caller whose context has ended meanwhile: select alone
	// would pick between the two at random.
	select {
	case <-ready:
		return nil
	default:
	}
	t := time.NewTimer(Patience)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
	case <-t.C:
	}
	return apierr.Starting(component)
}

// Visible runs wait (typically a view's WaitSeen or WaitFor on the write's sequence) with at
// most Patience, and answers apierr.NotYetVisible(what, …) when it fails: the write stands, a
// read shortly after sees it.
func Visible(ctx context.Context, what string, wait func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, Patience)
	defer cancel()
	if err := wait(ctx); err != nil {
		return apierr.NotYetVisible(what, err)
	}
	return nil
}

// Gate is a service's readiness as its handlers check it: the Ready channel it closes once it
// answers from current state, and the name its "is starting" answer gives.
type Gate struct {
	ready     <-chan struct{}
	component string
}

// NewGate returns the gate of component, open once ready is closed.
func NewGate(ready <-chan struct{}, component string) Gate {
	return Gate{ready: ready, component: component}
}

// Ready is Ready for the gate's service.
func (g Gate) Ready(ctx context.Context) error {
	return Ready(ctx, g.ready, g.component)
}

// Admit is how a handler starts: the request's violations, if v holds any (v may be nil), and
// otherwise Ready. A bad request is refused at once, even while the service starts.
func (g Gate) Admit(ctx context.Context, v *apierr.Violations) error {
	if v != nil {
		if err := v.Err(); err != nil {
			return err
		}
	}
	return g.Ready(ctx)
}
