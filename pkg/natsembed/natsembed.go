// Package natsembed runs nats-server with JetStream inside the process: fleetd's single node, and
// the single nodes and three-node clusters that tests start.
package natsembed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// Config describes one embedded server.
type Config struct {
	// Name of the server; in a cluster every node needs its own.
	Name string
	// StoreDir holds JetStream's file store; it survives restarts.
	StoreDir string
	// Host and Port for clients; Port -1 picks a free one.
	Host string
	Port int
	// Cluster settings; ClusterName empty means a single node.
	ClusterName string
	ClusterHost string
	ClusterPort int
	Routes      []string
	// Auth, when set, decides who may connect and with which permissions.
	Auth server.Authentication
	// Logger receives the server's log lines; nil silences them.
	Logger *zap.Logger
	// MaxPayload is the largest message the server accepts (default DefaultMaxPayload).
	MaxPayload int32
}

// DefaultMaxPayload is the embedded server's max_payload, as in deploy/nats (nats-server's own
// default is 1 MB).
const DefaultMaxPayload = 8 << 20

// Server is a running embedded nats-server.
type Server struct {
	*server.Server
	cfg Config
}

// Start starts a server and waits until it accepts clients.
func Start(cfg Config) (*Server, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	opts := &server.Options{
		ServerName:                 cfg.Name,
		Host:                       cfg.Host,
		Port:                       cfg.Port,
		JetStream:                  true,
		StoreDir:                   cfg.StoreDir,
		NoSigs:                     true,
		NoSystemAccount:            false,
		MaxPayload:                 DefaultMaxPayload,
		CustomClientAuthentication: cfg.Auth,
	}
	if cfg.ClusterName != "" {
		opts.Cluster = server.ClusterOpts{Name: cfg.ClusterName, Host: cfg.ClusterHost, Port: cfg.ClusterPort}
		opts.Routes = server.RoutesFromStr(strings.Join(cfg.Routes, ","))
	}
	if cfg.MaxPayload > 0 {
		opts.MaxPayload = cfg.MaxPayload
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("new nats server: %w", err)
	}
	if cfg.Logger != nil {
		ns.SetLoggerV2(zapLogger{cfg.Logger.Sugar()}, false, false, false)
	}
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("nats server not ready for connections after 30s")
	}
	return &Server{Server: ns, cfg: cfg}, nil
}

// Stop shuts the server down and waits until it has.
func (s *Server) Stop() {
	s.Shutdown()
	s.WaitForShutdown()
}

// Config returns the configuration the server was started with, with the port it listens on.
func (s *Server) Config() Config {
	c := s.cfg
	c.Port = s.Addr().(*net.TCPAddr).Port
	return c
}

// FreePort returns a loopback TCP port that was free a moment ago (for cluster route ports,
// which cannot be -1 because peers must know them up front).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Cluster is a set of routed embedded servers.
type Cluster struct {
	Nodes   []*Server
	configs []Config
}

// StartCluster starts n routed nodes with store directories under dirs (one per node) and waits
// until JetStream has a meta leader.
func StartCluster(ctx context.Context, name string, dirs []string, logger *zap.Logger) (*Cluster, error) {
	n := len(dirs)
	ports := make([]int, n)
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = "nats-route://127.0.0.1:" + strconv.Itoa(p)
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		cfg := Config{
			Name: fmt.Sprintf("%s-%d", name, i), StoreDir: dirs[i], Port: -1,
			ClusterName: name, ClusterHost: "127.0.0.1", ClusterPort: ports[i], Routes: routes,
			Logger: logger,
		}
		s, err := Start(cfg)
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("start node %d: %w", i, err)
		}
		c.Nodes = append(c.Nodes, s)
		c.configs = append(c.configs, s.Config())
	}
	return c, c.WaitForMetaLeader(ctx)
}

// WaitForMetaLeader blocks until a client sees JetStream available on the cluster.
func (c *Cluster) WaitForMetaLeader(ctx context.Context) error {
	for {
		for _, n := range c.Nodes {
			if n.Running() && n.JetStreamIsLeader() {
				return nil
			}
		}
		for _, n := range c.Nodes {
			if n.Running() && n.JetStreamIsClustered() {
				if nc, err := nats.Connect(n.ClientURL()); err == nil {
					js, _ := jetstream.New(nc)
					cctx, cancel := context.WithTimeout(ctx, time.Second)
					_, err = js.AccountInfo(cctx)
					cancel()
					nc.Close()
					if err == nil {
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for jetstream meta leader: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ClientURLs lists every running node's client URL, for a client that fails over.
func (c *Cluster) ClientURLs() string {
	var urls []string
	for _, n := range c.Nodes {
		if n.Running() {
			urls = append(urls, n.ClientURL())
		}
	}
	return strings.Join(urls, ",")
}

// Restart starts node i again with its original configuration and store.
func (c *Cluster) Restart(i int) error {
	s, err := Start(c.configs[i])
	if err != nil {
		return err
	}
	c.Nodes[i] = s
	return nil
}

// Stop stops every node.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		if n != nil && n.Running() {
			n.Stop()
		}
	}
}

// zapLogger adapts zap to nats-server's Logger interface.
type zapLogger struct{ s *zap.SugaredLogger }

func (l zapLogger) Noticef(format string, v ...any) { l.s.Infof(format, v...) }
func (l zapLogger) Warnf(format string, v ...any)   { l.s.Warnf(format, v...) }
func (l zapLogger) Fatalf(format string, v ...any)  { l.s.Errorf(format, v...) }
func (l zapLogger) Errorf(format string, v ...any)  { l.s.Errorf(format, v...) }
func (l zapLogger) Debugf(format string, v ...any)  { l.s.Debugf(format, v...) }
func (l zapLogger) Tracef(format string, v ...any)  { l.s.Debugf(format, v...) }
