// Command cluster-agent runs in (or for) one member cluster: it reports heartbeats and the
// namespace inventory to the hub's JetStream and applies the cluster's desired state. With
// --hosted it runs on the hub, for every cluster that has stored credentials and no agent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetstream/fleetstream/pkg/flagcheck"
	"github.com/fleetstream/fleetstream/pkg/logging"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/pkg/version"
	"github.com/fleetstream/fleetstream/services/cluster-agent/hosted"
	"github.com/fleetstream/fleetstream/services/cluster-agent/member"
)

// options are the binary's flags: the agents' own (hosted.Config, which fleetd takes too),
// and which cluster, NATS and logging, which are the binary's.
type options struct {
	agents        hosted.Config
	cluster       string
	natsURL       string
	natsTokenFile string
	kubeconfig    string
	clusterID     string
	hosted        bool
	logLevel      string
	logDev        bool
}

func (o *options) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.cluster, "cluster", "", "name of this member cluster in the registry (required without --hosted)")
	fs.BoolVar(&o.hosted, "hosted", false, "run on the hub the agents of every cluster that has stored credentials and no agent of its own; --nats-token-file is then the hosted-agent service's token")
	o.agents.RegisterFlags(fs)
	fs.StringVar(&o.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated")
	fs.StringVar(&o.natsTokenFile, "nats-token-file", "", "file holding the agent's NATS token (optional)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the member cluster; in-cluster config when empty")
	fs.StringVar(&o.clusterID, "cluster-id", "", "the cluster's registry id, sent with EndpointSlice reports (optional; the collector also reads it from the registry)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.logDev, "log-dev", false, "human-readable console logs")
}

func (o *options) Validate() error {
	var mode error
	switch {
	case o.hosted && (o.cluster != "" || o.kubeconfig != "" || o.clusterID != ""):
		mode = errors.New("--hosted runs the agents of many clusters: --cluster, --cluster-id and --kubeconfig do not apply")
	case o.hosted && o.natsTokenFile == "":
		mode = errors.New("--hosted needs --nats-token-file: the hosted-agent service's NATS token")
	case !o.hosted && o.cluster == "":
		mode = errors.New("--cluster is required (or --hosted)")
	}
	return errors.Join(mode, flagcheck.NATSURLs("nats-url", o.natsURL), o.agents.Validate())
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cluster-agent:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var o options
	fs := flag.NewFlagSet("cluster-agent", flag.ContinueOnError)
	o.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	o.agents.Member.Version = version.Version

	log, err := logging.New(o.logLevel, o.logDev)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if o.hosted {
		return runHosted(ctx, o, log)
	}
	kubeCfg, err := kubeConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	nc, err := connectNATS(o, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	memberCfg := o.agents.Member
	memberCfg.ClusterName, memberCfg.ClusterID = o.cluster, o.clusterID
	a, err := member.New(memberCfg, js, kubeCfg, log)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// runHosted runs the agents of every cluster with stored credentials and no agent of its own
// (package hosted), connected to NATS as the hosted-agent service.
func runHosted(ctx context.Context, o options, log *zap.Logger) error {
	token, err := readToken(o.natsTokenFile)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(o.natsURL,
		nats.Name("cluster-agent-hosted"),
		nats.Token(token),
		nats.CustomInboxPrefix(natsauth.ServiceInboxPrefix(natsauth.ServiceHostedAgent)),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(time.Second),
		nats.IgnoreAuthErrorAbort(), // as connectNATS
	)
	if err != nil {
		return fmt.Errorf("connect to nats %s: %w", o.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	cfg := o.agents
	cfg.NATSURL, cfg.ServiceToken = o.natsURL, token
	sup, err := hosted.New(cfg, js, log)
	if err != nil {
		return err
	}
	return sup.Run(ctx)
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("nats token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (or pass --kubeconfig): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, nil
}

// connectNATS connects with unlimited reconnects and retries on the first connect too, so an
// agent started before the hub (or during an outage) comes up and waits instead of exiting.
func connectNATS(o options, log *zap.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("cluster-agent/" + o.cluster),
		// The hub lets an agent receive replies only under its own inbox prefix.
		nats.CustomInboxPrefix(natsauth.AgentInboxPrefix(o.cluster)),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectWait(time.Second),
		// After a hub restart the auth callout refuses agents until the registry has caught
		// up; nats.go would close the connection at the second refusal in a row, and the agent
		// would be gone for good (docs/scale.md, storm). A revoked agent keeps knocking, once
		// per reconnect wait, and keeps being refused.
		nats.IgnoreAuthErrorAbort(),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats disconnected", zap.Error(err))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", zap.String("url", nc.ConnectedUrlRedacted()))
		}),
	}
	if o.natsTokenFile != "" {
		token, err := readToken(o.natsTokenFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Token(token))
	}
	nc, err := nats.Connect(o.natsURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", o.natsURL, err)
	}
	return nc, nil
}
