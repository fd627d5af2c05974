package rbacsync

import (
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
)

// A fan-out term that starts while NATS cannot answer (a hub restarted under a storm of
// reconnecting agents, here a server that is down) waits for it and loads the bucket then:
// before, the first failed request ended rbac-sync, and with it fleetd (docs/scale.md).
func TestFanoutLoadRidesOutANATSOutage(t *testing.T) {
	j := testkit.StartJetStream(t)
	ctx := testkit.Context(t, 2*time.Minute)
	kv, err := j.JS.CreateKeyValue(ctx, subjects.FeedBucketConfig(subjects.DesiredRBACBucket, "desired-rbac"))
	if err != nil {
		t.Fatal(err)
	}
	key := target{cluster: "c1", namespace: "ns1", template: "viewer"}.key()
	if _, err := kv.Put(ctx, key, []byte{}); err != nil {
		t.Fatal(err)
	}
	_, js := j.Connect(t)
	f := newFanout(js, zaptest.NewLogger(t))
	f.loadStall = 3 * time.Second
	if f.kv, err = js.KeyValue(ctx, subjects.DesiredRBACBucket); err != nil {
		t.Fatal(err)
	}

	cfg := j.Server.Config()
	j.Server.Stop()
	loaded := make(chan error, 1)
	go func() {
		w, err := f.loadRetrying(ctx)
		if err == nil {
			_ = w.Stop()
		}
		loaded <- err
	}()
	time.Sleep(2 * time.Second) // several attempts fail meanwhile
	s, err := natsembed.Start(cfg)
	if err != nil {
		t.Fatalf("restart nats: %v", err)
	}
	t.Cleanup(s.Stop)
	select {
	case err := <-loaded:
		if err != nil {
			t.Fatalf("load after the outage: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the bucket was not loaded within 60 s of NATS coming back")
	}
	if _, ok := f.written[key]; !ok {
		t.Errorf("the bucket's key was not loaded: %v", f.written)
	}
}
