package kubebridge

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleetstream/fleetstream/pkg/daemon"
	"github.com/fleetstream/fleetstream/pkg/flagcheck"
)

// Config configures the bridge. The zero value is off (no hub kubeconfig).
type Config struct {
	// Kubeconfig is the file of the hub API server's kubeconfig (--kube-bridge-kubeconfig);
	// empty turns the bridge off. It is the operator's own file, read as kubectl reads it.
	Kubeconfig string
	// InCluster connects to the API server the bridge's pod runs in, with its ServiceAccount
	// (--kube-bridge-in-cluster): the hub chart's default, where the cluster Fleetstream is
	// installed in is the hub. Exclusive with Kubeconfig.
	InCluster bool
	// Namespace is the hub namespace of the ClusterProfiles (--kube-bridge-namespace), created
	// if missing.
	Namespace string
	// Resync queues every key again this often (default 10 minutes): the safety net for a
	// change no watch delivered.
	Resync time.Duration
	// Workers reconcile concurrently, per kind (default 2).
	Workers int
	// APIURL is the base URL of Fleetstream's API the bridge writes the fleetstream.io custom
	// resources through (--kube-bridge-api-url; fleetd: its own listener).
	APIURL string
	// APITokenFile holds the bearer token of the bridge's own API user, which acts for the
	// namespaced kinds (NamespaceBinding, ProjectRoleBinding, Placement, ClusterSetBinding) and should be project-owner in
	// the mapped projects only (--kube-bridge-api-token-file). Empty: no write side.
	APITokenFile string
	// ProjectsTokenFile holds the token of a platform admin, used for the cluster-scoped kinds
	// only (Project, RoleTemplate, ClusterSet), which hub RBAC restricts to hub admins
	// (--kube-bridge-projects-token-file). Empty: they are not reconciled (status NotConfigured).
	ProjectsTokenFile string

	// leaseReplicas are the replicas of the lease bucket if the bridge is the first to create
	// it: the binary's --replicas (NewFromEnv); 1 in fleetd, whose NATS is one node.
	leaseReplicas int
}

// DefaultNamespace holds the ClusterProfiles unless --kube-bridge-namespace says otherwise.
const DefaultNamespace = "fleetstream-system"

// RegisterFlags adds the bridge's flags to fs: kube-bridge's and fleetd's, so both take the same
// names and defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kube-bridge-kubeconfig", "", "kubeconfig file of the hub Kubernetes API server the kube bridge publishes the fleet to (ClusterProfiles, PlacementDecisions; docs/kubernetes.md); empty: no bridge")
	fs.BoolVar(&c.InCluster, "kube-bridge-in-cluster", false, "publish to the Kubernetes API server the kube bridge runs in, as its pod's ServiceAccount (instead of --kube-bridge-kubeconfig)")
	fs.StringVar(&c.Namespace, "kube-bridge-namespace", DefaultNamespace, "hub namespace of the kube bridge's ClusterProfiles, created if missing")
	fs.DurationVar(&c.Resync, "kube-bridge-resync", 0, "how often the kube bridge looks at every object again (default 10m)")
	fs.StringVar(&c.APIURL, "kube-bridge-api-url", "", "base URL of Fleetstream's API the kube bridge writes fleetstream.io objects of the hub through (fleetd: its own listener)")
	fs.StringVar(&c.APITokenFile, "kube-bridge-api-token-file", "", "file with the API token of the kube bridge's own user, project-owner in the mapped projects only, for the hub's namespaced fleetstream.io objects (NamespaceBinding, ProjectRoleBinding, Placement, ClusterSetBinding); empty: the bridge writes nothing into Fleetstream")
	fs.StringVar(&c.ProjectsTokenFile, "kube-bridge-projects-token-file", "", "file with a platform admin's API token, used for the hub's cluster-scoped fleetstream.io objects only (Project, RoleTemplate, ClusterSet); empty: they are not reconciled")
}

// Enabled reports whether a hub was given (a kubeconfig, or the cluster the bridge runs in).
func (c *Config) Enabled() bool { return c.Kubeconfig != "" || c.InCluster }

// Validate checks the values of the flags RegisterFlags adds, naming the flag of a bad one.
func (c *Config) Validate() error {
	var ns error
	if c.Namespace != "" { // empty: DefaultNamespace
		for _, msg := range validation.IsDNS1123Label(c.Namespace) {
			ns = errors.Join(ns, fmt.Errorf("--kube-bridge-namespace %q: %s", c.Namespace, msg))
		}
	}
	var api error
	if c.InCluster && c.Kubeconfig != "" {
		api = errors.New("--kube-bridge-in-cluster and --kube-bridge-kubeconfig name the hub twice: give one")
	}
	if c.ProjectsTokenFile != "" && c.APITokenFile == "" {
		api = errors.Join(api, errors.New("--kube-bridge-projects-token-file needs --kube-bridge-api-token-file"))
	}
	return errors.Join(ns, api,
		flagcheck.NotNegative("kube-bridge-resync", c.Resync),
	)
}

func (c *Config) withDefaults() {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Resync <= 0 {
		c.Resync = 10 * time.Minute
	}
	if c.Workers <= 0 {
		c.Workers = 2
	}
}

// NewFromEnv constructs the bridge as its binary runs it: on env's connection (the kube-bridge
// service's NATS identity, which may only read the views it mirrors), writing to the hub named
// by cfg.Kubeconfig.
func NewFromEnv(_ context.Context, env *daemon.Env, cfg Config) (*Bridge, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, errors.New("--kube-bridge-kubeconfig or --kube-bridge-in-cluster is required")
	}
	if cfg.APITokenFile != "" && cfg.APIURL == "" {
		return nil, errors.New("--kube-bridge-api-token-file needs --kube-bridge-api-url (the Fleetstream API the bridge writes through)")
	}
	cfg.leaseReplicas = env.Options.Replicas
	return NewFromKubeconfig(cfg, env.JS, env.Log)
}

// ServesNoAPI tells pkg/daemon the bridge serves no API: its daemon starts no authorizer, which
// its NATS identity could not feed (it may read only the views it mirrors).
func (c *Config) ServesNoAPI() bool { return true }
