package apiwait_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	"github.com/fleetstream/fleetstream/pkg/apiwait"
)

func TestReady(t *testing.T) {
	ready := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := apiwait.Ready(ctx, ready, "rbac-sync"); connect.CodeOf(err) != connect.CodeUnavailable || err.Error() != "unavailable: rbac-sync is starting" {
		t.Fatalf("not ready: %v", err)
	}
	close(ready)
	if err := apiwait.Ready(ctx, ready, "rbac-sync"); err != nil {
		t.Fatalf("ready: %v", err)
	}
}

func TestVisible(t *testing.T) {
	var deadline bool
	err := apiwait.Visible(context.Background(), "weight", func(ctx context.Context) error {
		_, deadline = ctx.Deadline()
		return errors.New("view at 6, write at 7")
	})
	if !deadline {
		t.Error("the wait is not bounded")
	}
	if connect.CodeOf(err) != connect.CodeUnavailable || err.Error() != "unavailable: weight accepted but not yet visible: view at 6, write at 7" {
		t.Fatalf("got %v", err)
	}
	if err := apiwait.Visible(context.Background(), "weight", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestGateAdmit(t *testing.T) {
	ready := make(chan struct{})
	g := apiwait.NewGate(ready, "cluster registry")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var bad apierr.Violations
	bad.Add("name", "required")
	// A bad request is refused as such even before the service is ready.
	if err := g.Admit(ctx, &bad); connect.CodeOf(err) != connect.CodeInvalidArgument || err.Error() != "invalid_argument: name: required" {
		t.Fatalf("bad request while starting: %v", err)
	}
	var good apierr.Violations
	if err := g.Admit(ctx, &good); connect.CodeOf(err) != connect.CodeUnavailable || err.Error() != "unavailable: cluster registry is starting" {
		t.Fatalf("good request while starting: %v", err)
	}
	close(ready)
	if err := g.Admit(ctx, &good); err != nil {
		t.Fatalf("ready: %v", err)
	}
	if err := g.Admit(ctx, nil); err != nil {
		t.Fatalf("ready, nothing to validate: %v", err)
	}
	if err := g.Admit(ctx, &bad); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("bad request once ready: %v", err)
	}
}
