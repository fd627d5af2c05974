// Package member assembles what the agent of one member cluster runs: heartbeats and the
// namespace inventory (package agent), the desired-state applier, import-source reports and
// EndpointSlice reports. The in-cluster binary and the hub-hosted agents build it the same way,
// so a hosted agent does exactly what an in-cluster one does.
package member

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetstream/fleetstream/pkg/protectedns"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
	"github.com/fleetstream/fleetstream/services/cluster-agent/endpointslices"
	"github.com/fleetstream/fleetstream/services/cluster-agent/mcs"
)

// Config configures one member cluster's agent. Zero durations and counts take the defaults of
// the packages they configure.
type Config struct {
	ClusterName string
	// ClusterID is sent with EndpointSlice reports (optional: the collector reads the registry).
	ClusterID          string
	HeartbeatInterval  time.Duration
	InventoryResync    time.Duration
	DesiredWorkers     int
	DesiredResync      time.Duration
	ImportSecretResend time.Duration
	// EndpointSlices selects the Services whose slices are reported; nil reports none.
	EndpointSlices *endpointslices.Filter
	Version        string
	// Hosted marks an agent the hub runs (see agent.Config.Hosted).
	Hosted bool
	// Protected are the namespaces the agent never adopts or writes into (desired.Config).
	Protected protectedns.List
}

// New returns the agent of cfg.ClusterName reporting through js about the cluster kubeCfg
// reaches; Run runs it.
func New(cfg Config, js jetstream.JetStream, kubeCfg *rest.Config, log *zap.Logger) (*agent.Agent, error) {
	kubeCfg = rest.CopyConfig(kubeCfg)
	kubeCfg.UserAgent = "fleetstream-cluster-agent/" + cfg.Version
	kube, err := kubernetes.NewForConfig(kubeCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client of cluster %s: %w", cfg.ClusterName, err)
	}
	dyn, err := dynamic.NewForConfig(kubeCfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic kubernetes client of cluster %s: %w", cfg.ClusterName, err)
	}
	// The export reporter's writes (a Conflict condition per export) get a client of their
	// own, so its client-side rate limit never delays the applier's.
	exportsDyn, err := dynamic.NewForConfig(kubeCfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic kubernetes client of cluster %s: %w", cfg.ClusterName, err)
	}
	return newWithClients(cfg, js, kube, dyn, exportsDyn, log)
}

// NewWithClients is New with the member cluster's clients given rather than built from a
// rest.Config: the fleet simulator (tools/fleetsim) runs the real agent against in-memory fake
// clients, with the same wiring as a real agent.
func NewWithClients(cfg Config, js jetstream.JetStream, kube kubernetes.Interface, dyn dynamic.Interface, log *zap.Logger) (*agent.Agent, error) {
	return newWithClients(cfg, js, kube, dyn, dyn, log)
}

func newWithClients(cfg Config, js jetstream.JetStream, kube kubernetes.Interface, dyn, exportsDyn dynamic.Interface, log *zap.Logger) (*agent.Agent, error) {
	// The agent does not create FLEET_AGENT: cluster-import owns it. Until it exists, publishes
	// fail and the agent keeps retrying.
	a, err := agent.New(agent.Config{
		ClusterName:       cfg.ClusterName,
		HeartbeatInterval: cfg.HeartbeatInterval,
		InventoryResync:   cfg.InventoryResync,
		AgentVersion:      cfg.Version,
		Hosted:            cfg.Hosted,
	}, js, kube, log)
	if err != nil {
		return nil, err
	}
	applier, err := desired.New(desired.Config{
		ClusterName:  cfg.ClusterName,
		Workers:      cfg.DesiredWorkers,
		ResyncPeriod: cfg.DesiredResync,
		Protected:    cfg.Protected,
	}, js, dyn, kube.Discovery(), log)
	if err != nil {
		return nil, err
	}
	a.Add(applier)
	// Reports what import policies naming this cluster as their source need; idle without any.
	a.Add(agent.NewImportWatcher(a, dyn, kube.Discovery(), agent.ImportWatchConfig{SecretResend: cfg.ImportSecretResend}))
	// Multi-cluster Services (KEP-1645): idle until the cluster serves ServiceExports.
	exports, err := mcs.New(mcs.Config{ClusterName: cfg.ClusterName, SessionID: a.SessionID()}, kube, exportsDyn, a.Store(), log)
	if err != nil {
		return nil, err
	}
	a.Add(exports)
	if cfg.EndpointSlices != nil {
		reporter, err := endpointslices.New(endpointslices.Config{
			ClusterName: cfg.ClusterName, ClusterID: cfg.ClusterID, Filter: *cfg.EndpointSlices, SessionID: a.SessionID(),
		}, a.Informers(), a.Store(), log)
		if err != nil {
			return nil, err
		}
		a.Add(reporter)
	}
	return a, nil
}
