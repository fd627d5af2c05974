// Command cluster-agent runs in (or for) one member cluster: it reports heartbeats and the
// namespace inventory to the hub's JetStream and applies the cluster's desired state.
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
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetstream/fleetstream/pkg/logging"
	"github.com/fleetstream/fleetstream/pkg/natsauth"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
	"github.com/fleetstream/fleetstream/services/cluster-agent/endpointslices"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type options struct {
	cluster           string
	natsURL           string
	natsTokenFile     string
	kubeconfig        string
	heartbeatInterval time.Duration
	inventoryResync   time.Duration
	desiredWorkers    int
	desiredResync     time.Duration
	endpointSlices    string
	clusterID         string
	importResend      time.Duration
	logLevel          string
	logDev            bool
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
	fs.StringVar(&o.cluster, "cluster", "", "name of this member cluster in the registry (required)")
	fs.StringVar(&o.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated")
	fs.StringVar(&o.natsTokenFile, "nats-token-file", "", "file holding the agent's NATS token (optional)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the member cluster; in-cluster config when empty")
	fs.DurationVar(&o.heartbeatInterval, "heartbeat-interval", agent.DefaultHeartbeatInterval, "how often to publish a heartbeat")
	fs.DurationVar(&o.inventoryResync, "inventory-resync", agent.DefaultInventoryResync, "how often to republish the namespace inventory without changes")
	fs.IntVar(&o.desiredWorkers, "desired-workers", desired.DefaultWorkers, "desired objects applied in parallel")
	fs.DurationVar(&o.desiredResync, "desired-resync", desired.DefaultResyncPeriod, "how often every desired object is re-applied and prune re-run without events")
	fs.StringVar(&o.endpointSlices, "endpointslices", "all", "EndpointSlices to report for multi-cluster endpoint collection: all, label=<key>[=<value>] or annotation=<key>[=<value>] on the Service, or off")
	fs.StringVar(&o.clusterID, "cluster-id", "", "the cluster's registry id, sent with EndpointSlice reports (optional; the collector also reads it from the registry)")
	fs.DurationVar(&o.importResend, "import-secret-resend", agent.DefaultSecretResend, "how often Secrets that import policies reference are sent to the hub again (the hub keeps them only in memory)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.logDev, "log-dev", false, "human-readable console logs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.cluster == "" {
		return errors.New("--cluster is required")
	}
	var sliceFilter endpointslices.Filter
	if o.endpointSlices != "off" {
		var err error
		if sliceFilter, err = endpointslices.ParseFilter(o.endpointSlices); err != nil {
			return fmt.Errorf("--endpointslices: %w", err)
		}
	}

	log, err := logging.New(o.logLevel, o.logDev)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	kubeCfg, err := kubeConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	kubeCfg.UserAgent = "fleetstream-cluster-agent/" + version
	kube, err := kubernetes.NewForConfig(kubeCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
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

	// The agent does not create FLEET_AGENT: cluster-import owns it. Until it exists, publishes
	// fail and the agent keeps retrying.
	a, err := agent.New(agent.Config{
		ClusterName:       o.cluster,
		HeartbeatInterval: o.heartbeatInterval,
		InventoryResync:   o.inventoryResync,
		AgentVersion:      version,
	}, js, kube, log)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(kubeCfg)
	if err != nil {
		return fmt.Errorf("dynamic kubernetes client: %w", err)
	}
	applier, err := desired.New(desired.Config{
		ClusterName:  o.cluster,
		Workers:      o.desiredWorkers,
		ResyncPeriod: o.desiredResync,
	}, js, dyn, kube.Discovery(), log)
	if err != nil {
		return err
	}
	a.Add(applier)
	// Reports what import policies naming this cluster as their source need; idle without any.
	a.Add(agent.NewImportWatcher(a, dyn, kube.Discovery(), agent.ImportWatchConfig{SecretResend: o.importResend}))
	if o.endpointSlices != "off" {
		reporter, err := endpointslices.New(endpointslices.Config{
			ClusterName: o.cluster, ClusterID: o.clusterID, Filter: sliceFilter, SessionID: a.SessionID(),
		}, a.Informers(), a.Store(), log)
		if err != nil {
			return err
		}
		a.Add(reporter)
	}
	return a.Run(ctx)
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
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats disconnected", zap.Error(err))
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", zap.String("url", nc.ConnectedUrlRedacted()))
		}),
	}
	if o.natsTokenFile != "" {
		b, err := os.ReadFile(o.natsTokenFile)
		if err != nil {
			return nil, fmt.Errorf("nats token: %w", err)
		}
		opts = append(opts, nats.Token(strings.TrimSpace(string(b))))
	}
	nc, err := nats.Connect(o.natsURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", o.natsURL, err)
	}
	return nc, nil
}
