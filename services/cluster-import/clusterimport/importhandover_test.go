package clusterimport_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// TestSharedClusterKeepsItsIdentity is issue 28 item 6: two sources render the same cluster
// name; one created it, the other adopted it. Deleting the creating source hands the cluster
// over to the adopter: it is never deregistered, its id stays, imported_by names the adopter,
// whose credentials become the cluster's. Deleting the last source deregisters it as before.
func TestSharedClusterKeepsItsIdentity(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, clusterimport.Config{})
	ctx := testkit.Context(t, 3*time.Minute)
	pc := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	get := func() (*clusterv1.Cluster, error) {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "shared"}))
		if err != nil {
			return nil, err
		}
		return res.Msg.Cluster, nil
	}
	register(t, e, "mgmt", nil)
	pol := lifecyclePolicy()
	pol.NameTemplate = "{{ .source.metadata.labels.cluster }}"
	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: pol})); err != nil {
		t.Fatal(err)
	}
	inv := &fakeInventory{t: t, j: j, store: events.NewStore(j.JS, "system:cluster-agent:mgmt"), cluster: "mgmt"}
	labels := map[string]string{"cluster": "shared", "env": "prod"}
	sources := []string{"a", "b"}
	for _, n := range sources {
		inv.source(n, true, labels, nil)
	}
	secrets := func(names ...string) {
		for _, n := range names {
			inv.secret(n+"-kubeconfig", kubeconfigFor("https://shared.example:6443", "token-from-"+n))
		}
	}
	var first *clusterv1.Cluster
	testkit.Eventually(t, 30*time.Second, func() error {
		secrets(sources...)
		c, err := get()
		if err != nil {
			return err
		}
		if c.ImportedBy == nil || len(c.AdoptedBy) != 1 || c.GetStatus().GetCredentialsFingerprint() == "" {
			return fmt.Errorf("not yet created by one source, with credentials, and adopted by the other: %v", c)
		}
		first = c
		return nil
	})
	creator, heir := first.ImportedBy.Source.Name, first.AdoptedBy[0].Source.Name
	if creator == heir {
		t.Fatalf("created and adopted by %s", creator)
	}

	// The creating source goes: the adopter takes the cluster over.
	inv.report(&agentv1.ImportObject{Name: creator, Deleted: true})
	testkit.Eventually(t, 30*time.Second, func() error {
		secrets(heir)
		c, err := get()
		if err != nil {
			return err
		}
		if c.Id != first.Id {
			return fmt.Errorf("id changed from %s to %s", first.Id, c.Id)
		}
		if c.ImportedBy.GetSource().GetName() != heir || len(c.AdoptedBy) != 0 {
			return fmt.Errorf("not handed over to %s: imported_by %v, adopted_by %v", heir, c.ImportedBy, c.AdoptedBy)
		}
		// The credentials the creator attached are replaced by the new creator's.
		creds, err := e.svc.Credentials(ctx, "shared")
		if err != nil {
			return err
		}
		if !strings.Contains(string(creds.GetKubeconfig()), "token-from-"+heir) {
			return errors.New("the cluster does not have the new creator's credentials")
		}
		return checkLifecycles(ctx, pc, map[string]lifecycleWant{heir: {mode: clusterv1.ImportMode_IMPORT_MODE_CREATED, cluster: "shared",
			reasons: map[string]string{clusterimport.ConditionCreated: "Created"}}})
	})
	evs := eventsOn(ctx, t, j.JS, subjects.Cluster("shared"))
	registered := 0
	for _, ev := range evs {
		if ev == "ClusterRegistered" {
			registered++
		}
	}
	if slices.Contains(evs, "ClusterDeregistered") || registered != 1 {
		t.Fatalf("the cluster was deregistered or registered again: %v", evs)
	}
	if evs[len(evs)-1] == "ImportedClusterRemoved" || !slices.Contains(evs[2:], "ClusterImported") {
		t.Fatalf("no handover: %v", evs)
	}

	// The last source goes: the cluster is deregistered, as any created cluster.
	inv.report(&agentv1.ImportObject{Name: heir, Deleted: true})
	testkit.Eventually(t, 30*time.Second, func() error {
		if _, err := get(); connect.CodeOf(err) != connect.CodeNotFound {
			return fmt.Errorf("cluster still registered: %v", err)
		}
		return nil
	})
	evs = eventsOn(ctx, t, j.JS, subjects.Cluster("shared"))
	if got := strings.Join(evs[len(evs)-2:], " "); got != "ImportedClusterRemoved ClusterDeregistered" {
		t.Fatalf("events end with %s: %v", got, evs)
	}
}
