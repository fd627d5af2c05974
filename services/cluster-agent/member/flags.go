package member

import (
	"errors"
	"flag"

	"github.com/fleetstream/fleetstream/pkg/flagcheck"
	"github.com/fleetstream/fleetstream/services/cluster-agent/agent"
	"github.com/fleetstream/fleetstream/services/cluster-agent/desired"
	"github.com/fleetstream/fleetstream/services/cluster-agent/endpointslices"
)

// RegisterFlags adds the flags of an agent's behaviour to fs: cluster-agent's (in a member
// cluster and with --hosted) and fleetd's, for the agents it hosts. Which cluster and how to
// reach it are the binary's own flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.HeartbeatInterval, "heartbeat-interval", agent.DefaultHeartbeatInterval, "how often to publish a heartbeat")
	fs.DurationVar(&c.InventoryResync, "inventory-resync", agent.DefaultInventoryResync, "how often to republish the namespace inventory without changes")
	fs.IntVar(&c.DesiredWorkers, "desired-workers", desired.DefaultWorkers, "desired objects applied in parallel")
	fs.DurationVar(&c.DesiredResync, "desired-resync", desired.DefaultResyncPeriod, "how often every desired object is re-applied and prune re-run without events")
	c.EndpointSlices = &endpointslices.Filter{Kind: "all"}
	fs.Var(endpointSlicesFlag{&c.EndpointSlices}, "endpointslices", "EndpointSlices to report for multi-cluster endpoint collection: all, label=<key>[=<value>] or annotation=<key>[=<value>] on the Service, or off")
	fs.DurationVar(&c.ImportSecretResend, "import-secret-resend", agent.DefaultSecretResend, "how often Secrets that import policies reference are sent to the hub again (the hub keeps them only in memory)")
	c.Protected.RegisterFlags(fs)
}

// Validate checks the values of the flags RegisterFlags adds, naming the flag of a bad one
// (--endpointslices and --protected-namespaces are checked as they are parsed).
func (c *Config) Validate() error {
	return errors.Join(
		flagcheck.NotNegative("heartbeat-interval", c.HeartbeatInterval),
		flagcheck.NotNegative("inventory-resync", c.InventoryResync),
		flagcheck.NotNegative("desired-workers", c.DesiredWorkers),
		flagcheck.NotNegative("desired-resync", c.DesiredResync),
		flagcheck.NotNegative("import-secret-resend", c.ImportSecretResend),
	)
}

// endpointSlicesFlag is --endpointslices: a filter, or "off" for none (nil).
type endpointSlicesFlag struct{ f **endpointslices.Filter }

func (v endpointSlicesFlag) String() string {
	if v.f == nil || *v.f == nil {
		return "off"
	}
	return (*v.f).String()
}

func (v endpointSlicesFlag) Set(s string) error {
	if s == "off" {
		*v.f = nil
		return nil
	}
	f, err := endpointslices.ParseFilter(s)
	if err != nil {
		return err
	}
	*v.f = &f
	return nil
}
