package server

import (
	"context"

	"golang.org/x/sync/errgroup"
)

// Component is one hub service as a process hosts it: it serves its APIs on a Server, runs its
// loops until ctx ends, and closes Ready once it answers from current state. fleetd hosts every
// component in one process, each daemon one; both construct them first and then Start them, so
// a construction that fails leaves nothing running but what the caller cancels.
type Component interface {
	Mount(srv *Server)
	Run(ctx context.Context) error
	Ready() <-chan struct{}
}

// Stopped is what a Component's Run returns for err, the outcome of its work: nil once ctx is
// done (stopped, possibly while starting, is not a failure), err otherwise.
func Stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Start mounts every component on srv and runs each in g until ctx ends (the first error
// stops g's context, and with it the others). It returns their Ready channels, in order.
func Start(ctx context.Context, g *errgroup.Group, srv *Server, cs ...Component) []<-chan struct{} {
	readies := make([]<-chan struct{}, 0, len(cs))
	for _, c := range cs {
		c.Mount(srv)
		g.Go(func() error { return c.Run(ctx) })
		readies = append(readies, c.Ready())
	}
	return readies
}
