package rbacsync

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// namespace-binding drops its view's bucket and builds it again when it cannot trust it (another
// projection version; a restored bucket without its checkpoint). rbac-sync's source of the view
// must ride that out: its Run returning the reader's "stream not found" stopped rbac-sync, and a
// fleetd with it (a restored fleetd never became ready). It attaches to the new bucket, ends the
// subscriptions of the old one, and a new subscription has the rebuilt view's bindings.
func TestBindingSourceAttachesAgainAfterTheViewIsRebuilt(t *testing.T) {
	ctx := testkit.Context(t, time.Minute)
	js := testkit.StartJetStream(t).JS
	cfg := jetstream.KeyValueConfig{Bucket: "ns-bindings", History: 1, Storage: jetstream.FileStorage}
	put := func(kv jetstream.KeyValue, key, project string) {
		t.Helper()
		data, err := proto.Marshal(&projectv1.NamespaceBinding{Id: key, Project: project, Cluster: "c1", Namespace: key})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := js.CreateKeyValue(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	put(kv, "old", "p1")
	src := newBindingSource(js, cfg.Bucket, testkit.Logger(t))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- src.Run(runCtx) }()
	select {
	case <-src.Ready():
	case <-ctx.Done():
		t.Fatal("the source never got ready")
	}
	snap, _, updates := src.Subscribe(ctx, 16)
	if len(snap) != 1 || snap[0].key != "old" {
		t.Fatalf("snapshot before the rebuild: %+v", snap)
	}

	// The rebuild: the bucket dropped and created again, with another binding.
	if err := js.DeleteKeyValue(ctx, cfg.Bucket); err != nil {
		t.Fatal(err)
	}
	if kv, err = js.CreateKeyValue(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	put(kv, "new", "p2")

	// The old subscription ends, so the fan-out subscribes again; Run goes on.
	deadline := time.After(20 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-updates:
		case err := <-runErr:
			t.Fatalf("the source stopped at the rebuild: %v", err)
		case <-deadline:
			t.Fatal("the subscription to the dropped bucket never ended")
		}
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		snap, _, ch := src.Subscribe(sctx, 16)
		got := map[string]bool{}
		for _, u := range snap {
			got[u.key] = u.grant != nil
		}
		if snap == nil { // attaching: the snapshot comes as updates, ending with its position
			for u := range ch {
				if u.key == "" {
					break
				}
				got[u.key] = u.grant != nil
			}
		}
		if len(got) != 1 || !got["new"] {
			return fmt.Errorf("bindings after the rebuild: %v", got)
		}
		return nil
	})
	select {
	case err := <-runErr:
		t.Fatalf("the source stopped: %v", err)
	default:
	}
}
