package placement

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

var (
	benchRegions  = []string{"eu-1", "eu-2", "us-1", "us-2", "ap-1"}
	benchEnvs     = []string{"prod", "staging", "dev"}
	benchVersions = []string{"v1.29", "v1.30", "v1.31", "v1.32"}
	benchSets     = []string{"set-0", "set-1", "set-2", "set-3"}
)

const benchKubeVersion = "kubeversion.fleetstream.io"

// benchFleet builds n clusters in four exclusive sets with regions, envs,
// claims, resources, 5% unreachable and 4% under maintenance, and an add-on
// score for each.
func benchFleet(n int, rng *rand.Rand, now time.Time) ([]Cluster, []ClusterSet, []AddOnScore) {
	clusters := make([]Cluster, n)
	scores := make([]AddOnScore, n)
	valid := now.Add(time.Hour)
	for i := range clusters {
		c := Cluster{
			Name: fmt.Sprintf("cluster-%05d", i),
			Labels: map[string]string{
				ClusterSetLabel: benchSets[i%len(benchSets)],
				"region":        benchRegions[rng.IntN(len(benchRegions))],
				"env":           benchEnvs[rng.IntN(len(benchEnvs))],
			},
			Claims: map[string]string{
				benchKubeVersion: benchVersions[rng.IntN(len(benchVersions))],
				"platform":       []string{"eks", "gke", "aks", "ocp"}[rng.IntN(4)],
			},
			Allocatable: map[ResourceName]resource.Quantity{
				ResourceCPU:    *resource.NewQuantity(int64(8+rng.IntN(248)), resource.DecimalSI),
				ResourceMemory: *resource.NewQuantity(int64(32+rng.IntN(992))<<30, resource.BinarySI),
			},
		}
		c.Capacity = c.Allocatable
		if i%20 == 0 {
			c.Taints = append(c.Taints, BuiltInTaint(TaintUnreachable, now.Add(-10*time.Minute)))
		}
		if i%25 == 3 {
			c.Taints = append(c.Taints, Taint{Key: "maintenance", Effect: TaintEffectNoSelect, TimeAdded: now.Add(-5 * time.Minute)})
		}
		clusters[i] = c
		scores[i] = AddOnScore{AddOnScoreKey: AddOnScoreKey{Cluster: c.Name, ResourceName: "telemetry", ScoreName: "cpuRatio"},
			Score: int32(rng.IntN(201) - 100), ValidUntil: &valid}
	}
	sets := defaultSets()
	for _, s := range benchSets {
		sets = append(sets, ClusterSet{Name: s})
	}
	return clusters, sets, scores
}

// benchPlacement: two predicates, one toleration, three prioritizers.
func benchPlacement() Placement {
	return Placement{
		Project: "team-a", Name: "eu-prod",
		NumberOfClusters: i32(20),
		Predicates: []Predicate{
			{RequiredClusterSelector: ClusterSelector{
				LabelSelector: metav1.LabelSelector{
					MatchLabels:      map[string]string{"env": "prod"},
					MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "region", Operator: metav1.LabelSelectorOpIn, Values: []string{"eu-1", "eu-2"}}},
				},
				ClaimSelector: claimIn(benchKubeVersion, "v1.31", "v1.32"),
			}},
			{RequiredClusterSelector: ClusterSelector{LabelSelector: matchLabels("region", "us-1"), ClaimSelector: claimIn("platform", "eks")}},
		},
		Tolerations: []Toleration{{Key: "maintenance", Operator: TolerationOpExists, TolerationSeconds: i64(3600)}},
		PrioritizerPolicy: PrioritizerPolicy{Mode: PrioritizerPolicyModeExact, Configurations: []PrioritizerConfig{
			builtIn(PrioritizerResourceAllocatableMemory, 2), builtIn(PrioritizerBalance, 1), addOn("telemetry", "cpuRatio", 1),
		}},
	}
}

// celBenchPlacement is benchPlacement with its first predicate written as
// CEL expressions instead of label and claim selectors; it selects the same
// clusters (v1.31 and v1.32 are the versions above 1.30.0).
func celBenchPlacement() Placement {
	p := benchPlacement()
	p.Predicates[0] = Predicate{RequiredClusterSelector: ClusterSelector{CELSelector: CELSelector{CELExpressions: []string{
		`managedCluster.metadata.labels["env"] == "prod" && managedCluster.metadata.labels["region"] in ["eu-1", "eu-2"]`,
		`semver(managedCluster.status.version.kubernetes, true).isGreaterThan(semver("1.30.0"))`,
	}}}}
	return p
}

// BenchmarkSchedule5000 decides one placement over 5,000 clusters and reports
// the per-decision p50 and p99 (the goal: p99 ≤ 50 ms), with label
// and claim selectors (selectors) and with the same predicate in CEL (cel),
// which is evaluated on every one of the 5,000 clusters.
// Run with -benchtime 300x or more for ≥ 200 decisions.
func BenchmarkSchedule5000(b *testing.B) {
	b.Run("selectors", func(b *testing.B) { benchSchedule5000(b, benchPlacement()) })
	b.Run("cel", func(b *testing.B) { benchSchedule5000(b, celBenchPlacement()) })
}

func benchSchedule5000(b *testing.B, p Placement) {
	now := fakeTime
	rng := rand.New(rand.NewPCG(1, 2))
	clusters, sets, scores := benchFleet(5000, rng, now)
	t0 := time.Now()
	f, err := NewFleet(clusters, sets, scores)
	if err != nil {
		b.Fatal(err)
	}
	fleetBuild := time.Since(t0)
	others := map[string]int{}
	for i := 0; i < len(clusters); i += 3 {
		others[clusters[i].Name] = 1 + rng.IntN(10)
	}
	st := PlacementState{BoundClusterSets: benchSets, OtherDecisions: others, Now: now}
	ctx := context.Background()
	// The first decision on a new fleet also builds what CEL reads of every
	// cluster; a fleet is rebuilt on every cluster change, so it is reported.
	t0 = time.Now()
	first, err := f.Schedule(ctx, &p, st)
	firstDecision := time.Since(t0)
	if err != nil || len(first.Clusters) != 20 {
		b.Fatalf("first decision %v: %v (%+v)", first.ClusterNames(), err, first.Conditions)
	}
	if want, _ := f.Schedule(ctx, new(benchPlacement()), st); !slices.Equal(first.ClusterNames(), want.ClusterNames()) {
		b.Fatalf("decided %v, the label and claim selectors decide %v: the placements are not equivalent", first.ClusterNames(), want.ClusterNames())
	}
	durations := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		d, err := f.Schedule(ctx, &p, st)
		durations = append(durations, time.Since(start))
		if err != nil || len(d.Clusters) != 20 {
			b.Fatalf("decision %v: %v", d.ClusterNames(), err)
		}
		st.PreviousDecision = d.ClusterNames()
	}
	b.StopTimer()
	slices.Sort(durations)
	b.ReportMetric(float64(percentile(durations, 50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(durations, 99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(len(durations)), "decisions")
	b.ReportMetric(float64(fleetBuild.Microseconds())/1000, "fleet-build-ms")
	b.ReportMetric(float64(firstDecision.Microseconds())/1000, "first-decision-ms")
}

func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(float64(p)/100*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// BenchmarkRedecide1000 changes one cluster's label, rebuilds the fleet and
// re-decides 1,000 placements over 1,000 clusters; in the same iteration a
// bare loop does the same filtering (set membership, predicates, taints),
// scoring (Balance, Steady, ResourceAllocatableMemory) and sorting on
// precompiled selectors, with no validation, groups, pages or conditions;
// it must pick the same clusters in the same order or the benchmark fails.
// Reported: ms per 1,000 re-decisions for both, and their ratio.
func BenchmarkRedecide1000(b *testing.B) {
	now := fakeTime
	rng := rand.New(rand.NewPCG(3, 4))
	clusters, sets, scores := benchFleet(1000, rng, now)
	placements := make([]Placement, 1000)
	states := make([]PlacementState, 1000)
	for i := range placements {
		p := Placement{
			Project: fmt.Sprintf("team-%d", i%50), Name: fmt.Sprintf("p-%d", i),
			NumberOfClusters: i32(int32(1 + rng.IntN(10))),
			Predicates: []Predicate{{RequiredClusterSelector: ClusterSelector{
				LabelSelector: matchLabels("region", benchRegions[rng.IntN(len(benchRegions))], "env", benchEnvs[rng.IntN(len(benchEnvs))]),
			}}},
			PrioritizerPolicy: PrioritizerPolicy{Configurations: []PrioritizerConfig{builtIn(PrioritizerResourceAllocatableMemory, 1)}},
		}
		if i%2 == 0 {
			p.Tolerations = []Toleration{{Key: "maintenance", Operator: TolerationOpExists}}
		}
		placements[i] = p
		states[i] = PlacementState{BoundClusterSets: benchSets, Now: now}
	}
	// First decisions, then the Balance counts they produce.
	f, err := NewFleet(clusters, sets, scores)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	total := map[string]int{}
	for i := range placements {
		d, err := f.Schedule(ctx, &placements[i], states[i])
		if err != nil {
			b.Fatal(err)
		}
		states[i].PreviousDecision = d.ClusterNames()
		for _, n := range states[i].PreviousDecision {
			total[n]++
		}
	}
	for i := range states {
		others := maps(total)
		for _, n := range states[i].PreviousDecision {
			others[n]--
		}
		states[i].OtherDecisions = others
	}
	base := newBareLoop(placements, states)

	var fsTotal, bareTotal time.Duration
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		// One cluster moves region.
		clusters[it%len(clusters)].Labels = maps(clusters[it%len(clusters)].Labels)
		clusters[it%len(clusters)].Labels["region"] = benchRegions[(it+1)%len(benchRegions)]

		start := time.Now()
		f, err := NewFleet(clusters, sets, scores)
		if err != nil {
			b.Fatal(err)
		}
		var selected []string
		for i := range placements {
			d, err := f.Schedule(ctx, &placements[i], states[i])
			if err != nil {
				b.Fatal(err)
			}
			selected = append(selected, d.ClusterNames()...)
		}
		fsTotal += time.Since(start)

		start = time.Now()
		bareSelected := base.run(clusters)
		bareTotal += time.Since(start)
		if !slices.Equal(bareSelected, selected) {
			b.Fatalf("bare loop selected %d clusters, scheduler %d, or different ones: the baseline is not doing the same work", len(bareSelected), len(selected))
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(fsTotal.Microseconds())/1000/n, "fleetstream-ms")
	b.ReportMetric(float64(bareTotal.Microseconds())/1000/n, "bare-ms")
	b.ReportMetric(float64(fsTotal)/float64(bareTotal), "ratio")
}

func maps[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// bareLoop is the baseline: what a hand-written loop needs to pick the same
// clusters for these placements.
type bareLoop struct {
	placements []Placement
	states     []PlacementState
	selectors  []labels.Selector
	prev       []map[string]bool
}

func newBareLoop(ps []Placement, sts []PlacementState) *bareLoop {
	b := &bareLoop{placements: ps, states: sts}
	for i, p := range ps {
		s, err := metav1.LabelSelectorAsSelector(&p.Predicates[0].RequiredClusterSelector.LabelSelector)
		if err != nil {
			panic(err)
		}
		b.selectors = append(b.selectors, s)
		prev := map[string]bool{}
		for _, n := range sts[i].PreviousDecision {
			prev[n] = true
		}
		b.prev = append(b.prev, prev)
	}
	return b
}

func (b *bareLoop) run(clusters []Cluster) []string {
	type cand struct {
		name  string
		mem   float64
		score int64
	}
	inSet := map[string]bool{}
	for _, s := range benchSets {
		inSet[s] = true
	}
	var selected []string
	cands := make([]cand, 0, len(clusters))
	for i, p := range b.placements {
		cands = cands[:0]
		for ci := range clusters {
			c := &clusters[ci]
			if !inSet[c.Labels[ClusterSetLabel]] || !b.selectors[i].Matches(labels.Set(c.Labels)) {
				continue
			}
			ok := true
			for _, t := range c.Taints {
				if t.Effect == TaintEffectNoSelect && !(len(p.Tolerations) > 0 && t.Key == p.Tolerations[0].Key) {
					ok = false
				}
			}
			if !ok {
				continue
			}
			m := c.Allocatable[ResourceMemory]
			cands = append(cands, cand{name: c.Name, mem: m.AsApproximateFloat64()})
		}
		minM, maxM := math.Inf(1), math.Inf(-1)
		maxCount := 0
		for _, v := range b.states[i].OtherDecisions {
			maxCount = max(maxCount, v)
		}
		for _, c := range cands {
			minM, maxM = math.Min(minM, c.mem), math.Max(maxM, c.mem)
		}
		for j := range cands {
			c := &cands[j]
			s := int64(100)
			if maxM != minM {
				s = int64(((c.mem-minM)/(maxM-minM) - 0.5) * 200)
			}
			if b.prev[i][c.name] {
				s += 100
			}
			if n, ok := b.states[i].OtherDecisions[c.name]; ok && maxCount > 0 {
				s += 2 * int64(100*(0.5-float64(n)/float64(maxCount)))
			} else {
				s += 100
			}
			c.score = s
		}
		sort.Slice(cands, func(x, y int) bool {
			if cands[x].score != cands[y].score {
				return cands[x].score > cands[y].score
			}
			return cands[x].name < cands[y].name
		})
		for _, c := range cands[:min(len(cands), int(*p.NumberOfClusters))] {
			selected = append(selected, c.name)
		}
	}
	return selected
}
