package placement

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Fleet is an immutable, indexed snapshot of the inputs every placement
// shares: clusters, cluster-set membership and add-on scores. Building it
// once per change and scheduling many placements against it is what keeps
// re-deciding 1,000 placements after one cluster change cheap.
type Fleet struct {
	clusters []fleetCluster // sorted by name: ties then break by index
	// names, labelSets, claimSets and tainted are by cluster index, apart
	// from clusters: every round reads them for every available or
	// feasible cluster, and packed they stay in cache where the clusters'
	// structs did not.
	names     []string
	labelSets []labels.Set
	claimSets []labels.Set
	tainted   []bool // the cluster has a taint
	resources []clusterResources
	byName    map[string]int
	// members maps each existing set to its member indexes, ascending.
	members map[string][]int
	// memberBits holds the same membership as bit sets (bit i: cluster i),
	// so a round over several bound sets ORs a few words per 64 clusters
	// instead of marking every member.
	memberBits map[string][]uint64
	scores     map[AddOnScoreKey]AddOnScore
	// cel holds the clusters as CEL sees them, built on first use.
	cel celInputs
	// avail memoises availableClusters' member lists by eligible sets:
	// a project's placements share their bound sets.
	avail struct {
		sync.Mutex
		m map[string][]int
	}
	// scratch recycles a round's working slices (*roundScratch): re-deciding
	// every placement after a change is thousands of rounds against one
	// fleet, and allocating them afresh each time was a fifth of the work.
	scratch sync.Pool
}

// fleetCluster is a Cluster as the fleet holds it; what the scheduler
// derives from it is packed by index in Fleet.
type fleetCluster struct {
	Cluster
}

// clusterResources is what the resource prioritizers read of a cluster.
type clusterResources struct {
	alloc [2]float64 // by resIndex
	has   [2]bool    // allocatable AND capacity present, as OCM requires
}

func resIndex(r ResourceName) int {
	if r == ResourceMemory {
		return 1
	}
	return 0
}

// NewFleet indexes clusters, sets and scores. Duplicate cluster or set names
// and unknown set selector types are errors: they are bugs of the caller's view.
// The fleet keeps the label, claim and resource maps it is given (copying
// 5,000 clusters' maps on every change would dominate re-decisions), so the
// caller must not modify them afterwards; a changed cluster is a new map.
func NewFleet(clusters []Cluster, sets []ClusterSet, scores []AddOnScore) (*Fleet, error) {
	f := &Fleet{
		clusters:   make([]fleetCluster, len(clusters)),
		names:      make([]string, len(clusters)),
		labelSets:  make([]labels.Set, len(clusters)),
		claimSets:  make([]labels.Set, len(clusters)),
		tainted:    make([]bool, len(clusters)),
		resources:  make([]clusterResources, len(clusters)),
		byName:     make(map[string]int, len(clusters)),
		members:    make(map[string][]int, len(sets)),
		memberBits: make(map[string][]uint64, len(sets)),
		scores:     make(map[AddOnScoreKey]AddOnScore, len(scores)),
	}
	for i := range clusters {
		f.clusters[i] = fleetCluster{Cluster: clusters[i]}
	}
	slices.SortFunc(f.clusters, func(a, b fleetCluster) int { return strings.Compare(a.Name, b.Name) })
	for i := range f.clusters {
		c := &f.clusters[i]
		if _, dup := f.byName[c.Name]; dup {
			return nil, fmt.Errorf("new fleet: duplicate cluster %q", c.Name)
		}
		f.byName[c.Name] = i
		f.names[i] = c.Name
		f.labelSets[i] = labels.Set(c.Labels)
		f.claimSets[i] = labels.Set(c.Claims)
		f.tainted[i] = len(c.Taints) > 0
		for _, r := range []ResourceName{ResourceCPU, ResourceMemory} {
			a, okA := c.Allocatable[r]
			_, okC := c.Capacity[r]
			if okA && okC {
				f.resources[i].alloc[resIndex(r)] = quantityFloat(a)
				f.resources[i].has[resIndex(r)] = true
			}
		}
	}
	for _, s := range sets {
		if _, dup := f.members[s.Name]; dup {
			return nil, fmt.Errorf("new fleet: duplicate cluster set %q", s.Name)
		}
		m, err := f.selectMembers(s)
		if err != nil {
			return nil, fmt.Errorf("new fleet: cluster set %q: %w", s.Name, err)
		}
		f.members[s.Name] = m
		bits := make([]uint64, wordsFor(len(f.clusters)))
		for _, i := range m {
			bits[i/64] |= 1 << (i % 64)
		}
		f.memberBits[s.Name] = bits
	}
	for _, sc := range scores {
		f.scores[sc.AddOnScoreKey] = sc
	}
	return f, nil
}

// wordsFor is the length of a bit set over n clusters.
func wordsFor(n int) int { return (n + 63) / 64 }

func quantityFloat(q resource.Quantity) float64 { return q.AsApproximateFloat64() }

// selectMembers mirrors OCM's GetClustersFromClusterSet, plus Fleetstream's
// rule that a cluster without the exclusive label is in the default set
// (OCM gets there by a controller labelling such clusters).
func (f *Fleet) selectMembers(s ClusterSet) ([]int, error) {
	var out []int
	switch s.Selector.Type {
	case "", SelectorExclusiveLabel:
		for i := range f.clusters {
			v, ok := f.clusters[i].Labels[ClusterSetLabel]
			if v == s.Name || (s.Name == DefaultClusterSet && (!ok || v == "")) {
				out = append(out, i)
			}
		}
	case SelectorLabelSelector:
		if s.Selector.LabelSelector == nil {
			return nil, nil // a nil selector selects none
		}
		sel, err := metav1.LabelSelectorAsSelector(s.Selector.LabelSelector)
		if err != nil {
			return nil, fmt.Errorf("label selector: %w", err)
		}
		for i := range f.clusters {
			if sel.Matches(f.labelSets[i]) {
				out = append(out, i)
			}
		}
	default:
		return nil, fmt.Errorf("unsupported selector type %q", s.Selector.Type)
	}
	return out, nil
}

// Members returns the names of a set's members, sorted, and whether the set exists.
func (f *Fleet) Members(set string) ([]string, bool) {
	idx, ok := f.members[set]
	if !ok {
		return nil, false
	}
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = f.clusters[j].Name
	}
	return out, true
}
