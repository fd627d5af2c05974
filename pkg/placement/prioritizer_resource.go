package placement

import (
	"math"
	"time"
)

// The resource prioritizers favour clusters with more allocatable CPU or memory.
const (
	PrioritizerResourceAllocatableCPU    = "ResourceAllocatableCPU"
	PrioritizerResourceAllocatableMemory = "ResourceAllocatableMemory"
)

// resourceAllocatable is OCM's ResourceAllocatable{CPU,Memory}
// (plugins/resource): allocatable scaled linearly between the feasible
// clusters' minimum (-100) and maximum (100).
type resourceAllocatable struct {
	res ResourceName
}

func (p resourceAllocatable) score(r *round, feasible []int, out []int64) time.Time {
	res := resIndex(p.res)
	minA, maxA, any := math.Inf(1), math.Inf(-1), false
	for _, i := range feasible {
		if c := &r.fleet.resources[i]; c.has[res] {
			any = true
			minA = math.Min(minA, c.alloc[res])
			maxA = math.Max(maxA, c.alloc[res])
		}
	}
	if !any {
		return time.Time{}
	}
	for j, i := range feasible {
		c := &r.fleet.resources[i]
		if !c.has[res] {
			continue // OCM leaves it unscored: it adds 0
		}
		if maxA-minA != 0 {
			ratio := (c.alloc[res] - minA) / (maxA - minA)
			out[j] = int64((ratio - 0.5) * 2.0 * 100.0)
		} else {
			out[j] = MaxClusterScore
		}
	}
	return time.Time{}
}
