// Package testkit starts the real things tests need: embedded JetStream servers (one node or a
// three-node cluster) and, in kube.go, kube-apiservers with etcd.
package testkit

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/fleetstream/fleetstream/pkg/natsembed"
)

// JetStream is a running single-node server and a client connected to it.
type JetStream struct {
	Server *natsembed.Server
	Conn   *nats.Conn
	JS     jetstream.JetStream
	dir    string
}

// StartJetStream starts a JetStream server in a temporary directory and stops it when the test
// ends.
func StartJetStream(t testing.TB) *JetStream {
	t.Helper()
	return StartJetStreamMaxPayload(t, 0)
}

// StartJetStreamMaxPayload is StartJetStream with the server's max_payload set to maxPayload
// bytes (0: natsembed.DefaultMaxPayload), for example nats-server's own default of 1 MB.
func StartJetStreamMaxPayload(t testing.TB, maxPayload int32) *JetStream {
	t.Helper()
	dir := t.TempDir()
	s, err := natsembed.Start(natsembed.Config{Name: "test", StoreDir: dir, Port: -1, MaxPayload: maxPayload})
	if err != nil {
		t.Fatalf("start jetstream: %v", err)
	}
	j := &JetStream{Server: s, dir: dir}
	j.connect(t)
	t.Cleanup(j.Stop)
	return j
}

func (j *JetStream) connect(t testing.TB) {
	nc, err := nats.Connect(j.Server.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	j.Conn, j.JS = nc, js
}

// Connect opens another client connection, closed when the test ends.
func (j *JetStream) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return ConnectURL(t, j.Server.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
}

// ConnectURL opens a client connection to url (one node of a cluster, say) with opts, closed
// when the test ends.
func ConnectURL(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// Stop closes the client and stops the server.
func (j *JetStream) Stop() {
	if j.Conn != nil {
		j.Conn.Close()
	}
	if j.Server.Running() {
		j.Server.Stop()
	}
}

// StartCluster starts a three-node JetStream cluster, stopped when the test ends.
func StartCluster(t testing.TB, logger *zap.Logger) *natsembed.Cluster {
	t.Helper()
	if logger == nil {
		logger = zap.NewNop()
	}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := natsembed.StartCluster(ctx, "fleet-test", dirs, logger)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// Logger returns a zap logger that writes through t.Log.
func Logger(t testing.TB) *zap.Logger {
	return zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
}

// Context returns a context cancelled when the test ends, with a deadline.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls cond until it returns nil or d passes, then fails with cond's last error.
func Eventually(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %s: %v", d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
