package apiwait_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"

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
