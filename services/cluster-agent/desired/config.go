package desired

import (
	"errors"
	"time"

	"github.com/fleetstream/fleetstream/pkg/protectedns"
)

// What the applier writes into every object it manages, and how it writes.
const (
	// FieldManager owns every field the agent applies; releasing an object is an empty apply
	// by this manager.
	FieldManager = "fleetstream-agent"
	// ManagedByLabel marks every managed object; informers and prune select on it.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "fleetstream"
	// DesiredKeyAnnotation holds `<bucket>/<key>` of the desired entry an object came from, so
	// an event on the object leads back to the entry to re-apply.
	DesiredKeyAnnotation = "fleetstream.io/desired-key"
)

// Defaults for zero Config fields.
const (
	DefaultWorkers      = 4
	DefaultResyncPeriod = 5 * time.Minute
)

// Config configures an Applier.
type Config struct {
	// ClusterName is the member cluster's name in the registry: the applier watches only the
	// desired keys under it.
	ClusterName string
	// Workers is how many desired keys are reconciled in parallel (default 4).
	Workers int
	// ResyncPeriod re-reconciles every desired key and re-runs prune even without events
	// (default 5m): it catches what no event announces, e.g. another owner's label removed.
	ResyncPeriod time.Duration
	// Protected are the namespaces the applier never adopts, labels or writes into, whatever
	// the hub asks (--protected-namespaces; the zero List protects the defaults). The hub's
	// API refuses them too; the agent does not rely on that.
	Protected protectedns.List
}

func (c *Config) defaults() error {
	if c.ClusterName == "" {
		return errors.New("cluster name is required")
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.ResyncPeriod <= 0 {
		c.ResyncPeriod = DefaultResyncPeriod
	}
	return nil
}
