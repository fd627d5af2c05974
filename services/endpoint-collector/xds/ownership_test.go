package xds

import (
	"fmt"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/endpoint-collector/collector"
)

// Issue 25 item 4 as proxies see it: team-a owns namespace web on c1, team-b owns web on c2.
// Each project's web/api is its own set of resources, made of its own clusters only, so a
// weight of 1,000 on c1 (team-a's) does not move team-b's proxies; before, one web/api:grpc
// merged both and sent ~91% of team-b's traffic to team-a's pods.
func TestEachOwningProjectHasItsOwnAssignment(t *testing.T) {
	h := startHarness(t, collector.Config{}, testkit.Logger(t))
	ctx := testkit.Context(t, 30*time.Second)
	nsb, err := h.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.NamespaceBindingsBucket})
	if err != nil {
		t.Fatal(err)
	}
	for cluster, project := range map[string]string{"c1": "team-a", "c2": "team-b"} {
		data, err := proto.Marshal(&projectv1.NamespaceBinding{Project: project, Cluster: cluster, Namespace: "web"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nsb.Put(ctx, keys.Join(cluster, "web"), data); err != nil {
			t.Fatal(err)
		}
	}
	c1, c2 := newAgent(t, h.js, "c1"), newAgent(t, h.js, "c2")
	c1.startHeartbeats(100 * time.Millisecond)
	c2.startHeartbeats(100 * time.Millisecond)
	c1.report("web", "api", "api-1", 9000, pod{"10.0.1.1", "R", "a"})
	c2.report("web", "api", "api-2", 9000, pod{"10.0.2.1", "R", "a"})

	teamA := ServiceResourceName(collector.ServiceRef{Namespace: "web", Name: "api", Project: "team-a"}, "grpc")
	teamB := ServiceResourceName(collector.ServiceRef{Namespace: "web", Name: "api", Project: "team-b"}, "grpc")
	merged := ResourceName("web", "api", "grpc")
	ads := newADSClient(t, dial(t, h.addr, tokenReader))
	ads.subscribe(resourcev3.EndpointType, teamA, teamB, merged)
	ads.subscribe(resourcev3.ListenerType, "api.web.team-b:grpc")
	expect := func(name, want string) {
		t.Helper()
		eventually(t, 10*time.Second, func() error {
			got, err := ads.assignment(name)
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("%s:\n got %s\nwant %s", name, got, want)
			}
			return nil
		})
	}
	expect(teamA, "c1/a@100[10.0.1.1:9000 w100 HEALTHY]")
	expect(teamB, "c2/a@100[10.0.2.1:9000 w100 HEALTHY]")
	eventually(t, 10*time.Second, func() error {
		if a, err := ads.get(resourcev3.ListenerType, "api.web.team-b:grpc"); err != nil || a == nil {
			return fmt.Errorf("team-b's listener: %v", err)
		}
		return nil
	})

	h.setClusterWeight("web", "api", "c1", 1000)
	expect(teamA, "c1/a@1000[10.0.1.1:9000 w1000 HEALTHY]")
	expect(teamB, "c2/a@100[10.0.2.1:9000 w100 HEALTHY]")
	if got, err := ads.assignment(merged); err == nil && got != "<empty>" && got != "<none>" {
		t.Fatalf("the merged web/api is served: %s", got)
	}
}
