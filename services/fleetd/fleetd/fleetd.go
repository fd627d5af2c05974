// Package fleetd runs every Fleetstream service in one process around an embedded JetStream
// server: the laptop, demo and test setup.
package fleetd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/fleetstream/fleetstream/pkg/natsembed"
	"github.com/fleetstream/fleetstream/pkg/server"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// Config is fleetd's configuration.
type Config struct {
	// DataDir holds JetStream's store; state survives restarts.
	DataDir string
	// Server is the one HTTP listener for every API, health and metrics.
	Server server.Config
	// NATSListen is host:port where agents reach the embedded NATS server.
	NATSListen    string
	ClusterImport clusterimport.Config
}

// Instance is a running fleetd.
type Instance struct {
	NATS          *natsembed.Server
	Conn          *nats.Conn
	JS            jetstream.JetStream
	ClusterImport *clusterimport.Service
	// Addr is where the HTTP listener listens.
	Addr string

	cancel context.CancelFunc
	group  *errgroup.Group
}

// Start starts the embedded server and every service and returns once the HTTP listener is
// bound; Ready tells when the services have caught up.
func Start(ctx context.Context, cfg Config, log *zap.Logger) (*Instance, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("fleetd: --data-dir is required")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("fleetd: data dir: %w", err)
	}
	host, port, err := splitHostPort(cfg.NATSListen)
	if err != nil {
		return nil, fmt.Errorf("fleetd: --nats-listen: %w", err)
	}
	srv, err := server.New(cfg.Server, log)
	if err != nil {
		return nil, err
	}
	ns, err := natsembed.Start(natsembed.Config{
		Name: "fleetd", StoreDir: filepath.Join(cfg.DataDir, "jetstream"), Host: host, Port: port, Logger: log.Named("nats"),
	})
	if err != nil {
		return nil, fmt.Errorf("fleetd: %w", err)
	}
	inst := &Instance{NATS: ns}
	ok := false
	defer func() {
		if !ok {
			inst.shutdown()
		}
	}()
	inst.Conn, err = nats.Connect("", nats.InProcessServer(ns), nats.Name("fleetd"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("fleetd: connect to embedded nats: %w", err)
	}
	if inst.JS, err = jetstream.New(inst.Conn); err != nil {
		return nil, fmt.Errorf("fleetd: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return nil, fmt.Errorf("fleetd: listen %s: %w", cfg.Server.Listen, err)
	}
	inst.Addr = ln.Addr().String()

	ctx, cancel := context.WithCancel(ctx)
	inst.cancel = cancel
	g, ctx := errgroup.WithContext(ctx)
	inst.group = g
	if inst.ClusterImport, err = clusterimport.New(ctx, inst.JS, cfg.ClusterImport, log); err != nil {
		_ = ln.Close()
		return nil, err
	}
	inst.ClusterImport.Mount(srv)
	g.Go(func() error { return inst.ClusterImport.Run(ctx) })
	g.Go(func() error { return srv.ServeListener(ctx, ln) })
	ok = true
	return inst, nil
}

// Ready is closed when every service answers from current state.
func (i *Instance) Ready() <-chan struct{} { return i.ClusterImport.Ready() }

// Wait blocks until the instance stops and returns the first error that stopped it.
func (i *Instance) Wait() error {
	err := i.group.Wait()
	i.shutdown()
	return err
}

// Stop stops every service and the embedded server.
func (i *Instance) Stop() {
	i.cancel()
	_ = i.group.Wait()
	i.shutdown()
}

func (i *Instance) shutdown() {
	if i.Conn != nil {
		i.Conn.Close()
	}
	if i.NATS != nil && i.NATS.Running() {
		i.NATS.Stop()
	}
}

func splitHostPort(hp string) (string, int, error) {
	if hp == "" {
		return "127.0.0.1", -1, nil
	}
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	if port == 0 {
		port = -1
	}
	return h, port, nil
}
