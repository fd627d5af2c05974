package clusterimport_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/events"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// Which policy and source object created or adopted a cluster is import-lifecycle data, which is
// admin-only: a signed-in user who reads, lists or watches clusters must not learn it.
func TestImportOriginIsAdminOnly(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, clusterimport.Config{Keyring: newRing(t, "k1")})
	ctx := testkit.Context(t, time.Minute)
	pc := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	register(t, e, "mgmt", nil)
	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: lifecyclePolicy()})); err != nil {
		t.Fatal(err)
	}
	inv := &fakeInventory{t: t, j: j, store: events.NewStore(j.JS, "system:cluster-agent:mgmt"), cluster: "mgmt"}
	inv.source("alpha", true, map[string]string{"env": "prod"}, nil)
	inv.secret("alpha-kubeconfig", kubeconfigFor("https://alpha.example:6443", "token-of-alpha-0123456789"))
	testkit.Eventually(t, 20*time.Second, func() error {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "alpha"}))
		if err != nil {
			return err
		}
		if res.Msg.Cluster.ImportedBy.GetPolicy() != "capi" {
			return fmt.Errorf("an admin sees alpha imported by %v", res.Msg.Cluster.ImportedBy)
		}
		return nil
	})

	bob := clusterv1connect.NewClusterServiceClient(testkit.BearerClient(http.DefaultClient, viewerToken), e.url)
	got, err := bob.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "alpha"}))
	if err != nil {
		t.Fatal(err)
	}
	if c := got.Msg.Cluster; c.ImportedBy != nil || len(c.AdoptedBy) != 0 {
		t.Errorf("GetCluster shows a non-admin the import origin: %v %v", c.ImportedBy, c.AdoptedBy)
	}
	list, err := bob.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list.Msg.Clusters {
		if c.ImportedBy != nil || len(c.AdoptedBy) != 0 {
			t.Errorf("ListClusters shows a non-admin the import origin of %s: %v %v", c.Name, c.ImportedBy, c.AdoptedBy)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := bob.WatchClusters(wctx, connect.NewRequest(&clusterv1.WatchClustersRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for seen < 2 && stream.Receive() {
		c := stream.Msg().Cluster
		if c.ImportedBy != nil || len(c.AdoptedBy) != 0 {
			t.Errorf("WatchClusters shows a non-admin the import origin of %s", c.Name)
		}
		seen++
	}
	if seen < 2 {
		t.Fatalf("watch ended after %d clusters: %v", seen, stream.Err())
	}
}
