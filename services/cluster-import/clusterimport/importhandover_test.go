package clusterimport_test

import (
	"context"
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

// sharedFixture is a cluster "shared" two lifecycles render.
type sharedFixture struct {
	pc   clusterv1connect.ImportPolicyServiceClient
	invs map[string]*fakeInventory
	// secrets are the source objects whose kubeconfig Secrets are reported.
	secrets []string
}

// TestSharedClusterKeepsItsIdentity is issue 28 item 6: two lifecycles render the same
// cluster name; one created it, the other adopted it. When the creating lifecycle ends (its
// source deleted, its policy deleted, its name changed) the cluster is handed over to the
// adopter: it is never deregistered, its id stays, imported_by names the adopter, whose
// credentials become the cluster's. When the last lifecycle ends it is deregistered as before.
func TestSharedClusterKeepsItsIdentity(t *testing.T) {
	labels := func(cluster string) map[string]string { return map[string]string{"cluster": cluster, "env": "prod"} }
	byLabel := lifecyclePolicy()
	byLabel.NameTemplate = "{{ .source.metadata.labels.cluster }}"
	// Policies are one per source type and inventory cluster: the second reads another one.
	second := lifecyclePolicy()
	second.Name = "capi2"
	second.Source.Cluster = "mgmt2"
	for _, tc := range []struct {
		name     string
		policies []*clusterv1.ImportPolicy
		// sources are reported, each with label cluster=shared.
		sources []string
		// leave ends the lifecycle (policy, source) holding the cluster.
		leave func(ctx context.Context, t *testing.T, f *sharedFixture, policy, source string)
	}{{
		name: "source deleted", policies: []*clusterv1.ImportPolicy{byLabel}, sources: []string{"a", "b"},
		leave: func(_ context.Context, _ *testing.T, f *sharedFixture, _, source string) {
			f.invs["mgmt"].report(&agentv1.ImportObject{Name: source, Deleted: true})
			f.secrets = slices.DeleteFunc(f.secrets, func(s string) bool { return s == source })
		},
	}, {
		name: "policy deleted", policies: []*clusterv1.ImportPolicy{lifecyclePolicy(), second}, sources: []string{"shared"},
		leave: func(ctx context.Context, t *testing.T, f *sharedFixture, policy, _ string) {
			if _, err := f.pc.DeleteImportPolicy(ctx, connect.NewRequest(&clusterv1.DeleteImportPolicyRequest{Name: policy})); err != nil {
				t.Fatal(err)
			}
		},
	}, {
		name: "name changed", policies: []*clusterv1.ImportPolicy{byLabel}, sources: []string{"a", "b"},
		leave: func(_ context.Context, _ *testing.T, f *sharedFixture, _, source string) {
			f.invs["mgmt"].source(source, true, labels("elsewhere-"+source), nil)
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			j := testkit.StartJetStream(t)
			e := start(t, j, clusterimport.Config{})
			ctx := testkit.Context(t, 3*time.Minute)
			f := &sharedFixture{pc: clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url),
				invs: map[string]*fakeInventory{}, secrets: tc.sources}
			for _, p := range tc.policies {
				inv := p.Source.Cluster
				f.invs[inv] = &fakeInventory{t: t, j: j, store: events.NewStore(j.JS, "system:cluster-agent:"+inv), cluster: inv}
			}
			get := func() (*clusterv1.Cluster, error) {
				res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "shared"}))
				if err != nil {
					return nil, err
				}
				return res.Msg.Cluster, nil
			}
			sendSecrets := func() {
				for inv, fi := range f.invs {
					for _, n := range f.secrets {
						fi.secret(n+"-kubeconfig", kubeconfigFor("https://shared.example:6443", "token-from-"+inv+"-"+n))
					}
				}
			}
			for inv := range f.invs {
				register(t, e, inv, nil)
			}
			for _, p := range tc.policies {
				if _, err := f.pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: p})); err != nil {
					t.Fatal(err)
				}
			}
			for _, fi := range f.invs {
				for _, n := range tc.sources {
					fi.source(n, true, labels("shared"), nil)
				}
			}
			var first *clusterv1.Cluster
			testkit.Eventually(t, 30*time.Second, func() error {
				sendSecrets()
				c, err := get()
				if err != nil {
					return err
				}
				if c.ImportedBy == nil || len(c.AdoptedBy) != 1 || c.GetStatus().GetCredentialsFingerprint() == "" {
					return fmt.Errorf("not yet created by one lifecycle, with credentials, and adopted by the other: %v", c)
				}
				first = c
				return nil
			})
			creator, heir := first.ImportedBy, first.AdoptedBy[0]

			// The creating lifecycle ends: the adopter takes the cluster over.
			tc.leave(ctx, t, f, creator.Policy, creator.Source.Name)
			testkit.Eventually(t, 30*time.Second, func() error {
				sendSecrets()
				c, err := get()
				if err != nil {
					return err
				}
				if c.Id != first.Id {
					return fmt.Errorf("id changed from %s to %s", first.Id, c.Id)
				}
				if c.ImportedBy.GetPolicy() != heir.Policy || c.ImportedBy.GetSource().GetName() != heir.Source.Name || len(c.AdoptedBy) != 0 {
					return fmt.Errorf("not handed over to %v: imported_by %v, adopted_by %v", heir, c.ImportedBy, c.AdoptedBy)
				}
				// The credentials the creator attached are replaced by the new creator's.
				creds, err := e.svc.Credentials(ctx, "shared")
				if err != nil {
					return err
				}
				if !strings.Contains(string(creds.GetKubeconfig()), "token-from-"+heir.Source.Cluster+"-"+heir.Source.Name) {
					return errors.New("the cluster does not have the new creator's credentials")
				}
				res, err := f.pc.ListImportLifecycles(ctx, connect.NewRequest(&clusterv1.ListImportLifecyclesRequest{Policy: heir.Policy}))
				if err != nil {
					return err
				}
				for _, lc := range res.Msg.Lifecycles {
					if lc.Source.Name == heir.Source.Name && (lc.Mode != clusterv1.ImportMode_IMPORT_MODE_CREATED || lc.ClusterId != first.Id) {
						return fmt.Errorf("the heir's lifecycle: %v", lc)
					}
				}
				return nil
			})
			evs := eventsOn(ctx, t, j.JS, subjects.Cluster("shared"))
			registered := 0
			for _, ev := range evs {
				if ev == "ClusterRegistered" {
					registered++
				}
			}
			if slices.Contains(evs, "ClusterDeregistered") || registered != 1 || !slices.Contains(evs[2:], "ClusterImported") {
				t.Fatalf("not handed over: %v", evs)
			}

			// The last lifecycle ends: the cluster is deregistered, as any created cluster.
			tc.leave(ctx, t, f, heir.Policy, heir.Source.Name)
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
		})
	}
}
