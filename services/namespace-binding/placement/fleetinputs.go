package placement

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"

	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	core "github.com/fleetstream/fleetstream/pkg/placement"
)

// fleetInputs turns the clusters, sets and scores the scheduler reads into its fleet and the
// fleet's fingerprint, remembering each cluster's part by the cluster's revision.
//
// Every change of a cluster (a joining fleet makes a thousand of them in seconds, every
// connection and condition change is one) woke the scheduler, which marshalled and parsed every
// cluster again to see whether anything it reads had changed: 12% of the hub's CPU while 1,000
// clusters joined (docs/scale.md). A cluster whose revision did not change has the same
// scheduling facts, so only the changed ones are encoded; the fingerprint is built exactly as
// before (a placement's stored input digest must not change with an upgrade, or every
// placement would be decided again).
type fleetInputs struct {
	byName map[string]clusterInput
}

// clusterInput is one cluster as the scheduler sees it, at revision rev.
type clusterInput struct {
	rev   uint64
	facts []byte // deterministic encoding of schedulingFacts, what the fingerprint covers
	core  core.Cluster
}

// build returns the fleet of clusters, sets and scores, and its fingerprint. When the
// fingerprint equals prevSum, the fleet is not rebuilt and build returns nil for it.
func (fi *fleetInputs) build(clusters []*clusterv1.Cluster, sets []*placementv1.ClusterSet, scores []*placementv1.AddOnScore, prevSum *[32]byte) (*core.Fleet, [32]byte, error) {
	if fi.byName == nil {
		fi.byName = make(map[string]clusterInput, len(clusters))
	}
	opts := proto.MarshalOptions{Deterministic: true}
	h := sha256.New()
	seen := make(map[string]struct{}, len(clusters))
	coreClusters := make([]core.Cluster, len(clusters))
	for i, c := range clusters {
		in, ok := fi.byName[c.Name]
		// Revision 0 is a cluster not (yet) from the event store: never trusted to be unchanged.
		if !ok || in.rev != c.Revision || c.Revision == 0 {
			b, _ := opts.Marshal(schedulingFacts(c))
			in = clusterInput{rev: c.Revision, facts: b, core: toCoreCluster(c)}
			fi.byName[c.Name] = in
		}
		seen[c.Name] = struct{}{}
		writeLen(h, in.facts)
		coreClusters[i] = in.core
	}
	for name := range fi.byName {
		if _, ok := seen[name]; !ok {
			delete(fi.byName, name)
		}
	}
	h.Write([]byte{0})
	for _, c := range sets {
		b, _ := opts.Marshal(&placementv1.ClusterSet{Name: c.Name, Selector: c.Selector})
		writeLen(h, b)
	}
	h.Write([]byte{0})
	for _, sc := range scores {
		b, _ := opts.Marshal(&placementv1.AddOnScore{Cluster: sc.Cluster, ResourceName: sc.ResourceName, ScoreName: sc.ScoreName, Score: sc.Score, ValidUntil: sc.ValidUntil})
		writeLen(h, b)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	if prevSum != nil && sum == *prevSum {
		return nil, sum, nil
	}
	coreSets := make([]core.ClusterSet, len(sets))
	for i, c := range sets {
		coreSets[i] = toPlacementSet(c)
	}
	coreScores := make([]core.AddOnScore, len(scores))
	for i, sc := range scores {
		coreScores[i] = toCoreScore(sc)
	}
	f, err := core.NewFleet(coreClusters, coreSets, coreScores)
	if err != nil {
		return nil, sum, fmt.Errorf("placement fleet: %w", err)
	}
	return f, sum, nil
}

// writeLen writes b prefixed by its length, so two encodings never run into each other.
func writeLen(h hash.Hash, b []byte) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}
