package placement

import (
	"crypto/sha256"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
)

func testClusters(n int) []*clusterv1.Cluster {
	out := make([]*clusterv1.Cluster, n)
	for i := range out {
		out[i] = &clusterv1.Cluster{Name: fmt.Sprintf("c%05d", i), Revision: uint64(i + 1),
			Labels: map[string]string{"env": []string{"prod", "dev"}[i%2], "zone": fmt.Sprint(i % 7)},
			Status: &clusterv1.ClusterStatus{Resources: &clusterv1.ClusterResources{
				Allocatable: map[string]string{"cpu": "8", "memory": "32Gi"}, Capacity: map[string]string{"cpu": "8", "memory": "32Gi"}}}}
	}
	return out
}

// The fingerprint a remembering fleetInputs computes is the one a fresh one computes from the
// same clusters, whatever it saw before: it is stored with every decision, and another replica
// (or this one after a restart) must come to the same one.
func TestFleetInputsFingerprintIsThatOfAFreshBuild(t *testing.T) {
	sets := []*placementv1.ClusterSet{{Name: "default"}}
	fresh := func(cs []*clusterv1.Cluster) [32]byte {
		var fi fleetInputs
		_, sum, err := fi.build(cs, sets, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	var fi fleetInputs
	cs := testClusters(50)
	f, sum, err := fi.build(cs, sets, nil, nil)
	if err != nil || f == nil {
		t.Fatalf("first build: fleet %v, err %v", f, err)
	}
	if sum != fresh(cs) {
		t.Fatal("first build differs from a fresh one")
	}
	steps := []struct {
		name        string
		change      func([]*clusterv1.Cluster) []*clusterv1.Cluster
		factsChange bool
	}{
		{"a condition changed (new revision, same facts)", func(cs []*clusterv1.Cluster) []*clusterv1.Cluster {
			c := cloneCluster(cs[3])
			c.Revision += 1000
			c.Status.Conditions = []*clusterv1.Condition{{Type: "Connected", Status: clusterv1.ConditionStatus_CONDITION_STATUS_TRUE}}
			cs[3] = c
			return cs
		}, false},
		{"a label changed", func(cs []*clusterv1.Cluster) []*clusterv1.Cluster {
			c := cloneCluster(cs[7])
			c.Revision += 1000
			c.Labels = map[string]string{"env": "staging"}
			cs[7] = c
			return cs
		}, true},
		{"resources changed", func(cs []*clusterv1.Cluster) []*clusterv1.Cluster {
			c := cloneCluster(cs[9])
			c.Revision += 1000
			c.Status.Resources = &clusterv1.ClusterResources{Allocatable: map[string]string{"cpu": "4"}}
			cs[9] = c
			return cs
		}, true},
		{"a cluster went", func(cs []*clusterv1.Cluster) []*clusterv1.Cluster {
			return append(cs[:10:10], cs[11:]...)
		}, true},
		{"it came back under its name with a new revision and other facts", func(cs []*clusterv1.Cluster) []*clusterv1.Cluster {
			c := cloneCluster(cs[10])
			c.Name, c.Revision, c.Labels = "c00010", 99999, map[string]string{"env": "new"}
			out := append(cs[:10:10], c)
			return append(out, cs[10:]...)
		}, true},
	}
	for _, step := range steps {
		cs = step.change(cs)
		prev := sum
		f, sum, err = fi.build(cs, sets, nil, &prev)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if want := fresh(cs); sum != want {
			t.Fatalf("%s: fingerprint differs from a fresh build's", step.name)
		}
		if changed := sum != prev; changed != step.factsChange {
			t.Fatalf("%s: fingerprint changed %v, want %v", step.name, changed, step.factsChange)
		}
		if (f != nil) != step.factsChange {
			t.Fatalf("%s: fleet rebuilt %v, want %v", step.name, f != nil, step.factsChange)
		}
	}
}

func cloneCluster(c *clusterv1.Cluster) *clusterv1.Cluster {
	out := &clusterv1.Cluster{Name: c.Name, Revision: c.Revision, Labels: c.Labels, Claims: c.Claims, Taints: c.Taints}
	if c.Status != nil {
		out.Status = &clusterv1.ClusterStatus{Resources: c.Status.Resources, Conditions: c.Status.Conditions}
	}
	return out
}

// everyClusterSum is refreshFleet's check before fleetInputs: every cluster encoded and hashed
// again (the fleet itself was rebuilt only when the sum changed).
func everyClusterSum(clusters []*clusterv1.Cluster, sets []*placementv1.ClusterSet) [32]byte {
	h := sha256.New()
	opts := proto.MarshalOptions{Deterministic: true}
	for _, c := range clusters {
		b, _ := opts.Marshal(schedulingFacts(c))
		writeLen(h, b)
	}
	h.Write([]byte{0})
	for _, c := range sets {
		b, _ := opts.Marshal(&placementv1.ClusterSet{Name: c.Name, Selector: c.Selector})
		writeLen(h, b)
	}
	h.Write([]byte{0})
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// BenchmarkFleetRefresh: the scheduler's work when one cluster of N changed in a way it cannot
// see (a condition: what a joining or reconnecting fleet makes by the thousand). "every-cluster"
// encodes every cluster again, as refreshFleet did; "by-revision" only the changed one.
//
//	go test -run '^$' -bench FleetRefresh ./placement/
func BenchmarkFleetRefresh(b *testing.B) {
	sets := []*placementv1.ClusterSet{{Name: "default"}}
	for _, n := range []int{1000, 5000} {
		cs := testClusters(n)
		for _, mode := range []string{"every-cluster", "by-revision"} {
			b.Run(fmt.Sprintf("clusters=%d/%s", n, mode), func(b *testing.B) {
				var fi fleetInputs
				_, sum, err := fi.build(cs, sets, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c := cloneCluster(cs[i%n])
					c.Revision += uint64(n)
					cs[i%n] = c
					if mode == "every-cluster" {
						if everyClusterSum(cs, sets) != sum {
							b.Fatal("facts changed")
						}
						continue
					}
					if _, _, err := fi.build(cs, sets, nil, &sum); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
