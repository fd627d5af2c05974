package clusterimport_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/keys"
	"github.com/fleetstream/fleetstream/pkg/subjects"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

const previewToken = "capi-admin-token-do-not-show"

var previewKubeconfig = base64.StdEncoding.EncodeToString([]byte(`apiVersion: v1
kind: Config
clusters:
- name: prod-eu
  cluster:
    server: https://10.0.0.1:6443
contexts:
- name: admin@prod-eu
  context: {cluster: prod-eu, user: admin}
current-context: admin@prod-eu
users:
- name: admin
  user:
    token: ` + previewToken + "\n"))

func capiPreviewPolicy() *clusterv1.ImportPolicy {
	return &clusterv1.ImportPolicy{
		Name:   "capi",
		Source: &clusterv1.ImportSource{Cluster: "mgmt", Group: "cluster.x-k8s.io", Version: "v1beta1", Resource: "clusters"},
		References: []*clusterv1.ImportReference{{Key: "kubeconfig", Version: "v1", Resource: "secrets",
			NamespaceTemplate: "{{ .source.metadata.namespace }}", NameTemplate: "{{ .source.metadata.name }}-kubeconfig"}},
		NameTemplate: "capi-{{ .source.metadata.name }}",
		Template: `labels:
  provider: capi
  env: "{{ .source.metadata.labels.env }}"
credentials:
  kubeconfig: "{{ .references.kubeconfig.data.value }}"
`,
		CreationCondition: `{{ range .source.status.conditions }}{{ if and (eq .type "Ready") (eq .status "True") }}true{{ end }}{{ end }}`,
	}
}

const capiSource = `{"apiVersion":"cluster.x-k8s.io/v1beta1","kind":"Cluster","metadata":{"name":"prod-eu","namespace":"fleet","labels":{"env":"prod"}},
"status":{"conditions":[{"type":"Ready","status":"True"}]}}`

func TestPreviewImportPolicyRendersWithoutCredentials(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	c := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	ctx := context.Background()
	secret := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"prod-eu-kubeconfig","namespace":"fleet"},"data":{"value":"` + previewKubeconfig + `"}}`
	res, err := c.PreviewImportPolicy(ctx, connect.NewRequest(&clusterv1.PreviewImportPolicyRequest{
		Policy: capiPreviewPolicy(), SourceObject: capiSource, References: map[string]string{"kubeconfig": secret}}))
	if err != nil {
		t.Fatal(err)
	}
	p := res.Msg
	if p.Name != "capi-prod-eu" || !p.Create || len(p.Errors) != 0 || p.Cluster == nil || !p.Cluster.CredentialsRendered ||
		p.Cluster.Labels["env"] != "prod" || p.Cluster.Labels["provider"] != "capi" {
		t.Fatalf("preview: %v", p)
	}
	if len(p.References) != 1 || p.References[0].Name != "prod-eu-kubeconfig" || p.References[0].Namespace != "fleet" {
		t.Fatalf("references: %v", p.References)
	}
	raw, _ := protojson.Marshal(p)
	for _, s := range []string{previewToken, previewKubeconfig[:40]} {
		if strings.Contains(string(raw), s) {
			t.Fatalf("the preview shows a credential: %s", raw)
		}
	}

	// A bad template is an answer naming the field, not a failed call; nothing is created.
	bad := capiPreviewPolicy()
	bad.References[0].NameTemplate = "{{ .source.metadata.name"
	res, err = c.PreviewImportPolicy(ctx, connect.NewRequest(&clusterv1.PreviewImportPolicyRequest{Policy: bad, SourceObject: capiSource}))
	if err != nil || len(res.Msg.Errors) == 0 || res.Msg.Errors[0].Field != "references[0].name_template" || res.Msg.Create {
		t.Fatalf("bad template: %v %v", res, err)
	}
	// A reference not supplied: the preview says which, and does not create.
	res, err = c.PreviewImportPolicy(ctx, connect.NewRequest(&clusterv1.PreviewImportPolicyRequest{Policy: capiPreviewPolicy(), SourceObject: capiSource}))
	if err != nil || len(res.Msg.Errors) == 0 || res.Msg.Create {
		t.Fatalf("missing reference: %v %v", res, err)
	}
	if _, err := c.PreviewImportPolicy(ctx, connect.NewRequest(&clusterv1.PreviewImportPolicyRequest{})); connect.CodeOf(err) != connect.CodeInvalidArgument ||
		!strings.Contains(err.Error(), "policy") || !strings.Contains(err.Error(), "source_object") {
		t.Fatalf("empty request: %v", err)
	}
	list, err := e.client.ListClusters(ctx, connect.NewRequest(&clusterv1.ListClustersRequest{}))
	if err != nil || len(list.Msg.Clusters) != 0 {
		t.Fatalf("a preview registered something: %v %v", list, err)
	}
}

func TestImportPolicyLifecycleOfTheSpec(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, clusterimport.Config{})
	c := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	ctx := testkit.Context(t, 60*time.Second)
	create := func(p *clusterv1.ImportPolicy) (*clusterv1.ImportPolicy, error) {
		res, err := c.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: p}))
		if err != nil {
			return nil, err
		}
		return res.Msg.Policy, nil
	}
	// The source cluster must be registered: its agent watches the source.
	if _, err := create(capiPreviewPolicy()); connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "policy.source.cluster") {
		t.Fatalf("unregistered source cluster: %v", err)
	}
	register(t, e, "mgmt", nil)
	got, err := create(capiPreviewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision == 0 || got.Creator != "alice" || got.NameTemplate != capiPreviewPolicy().NameTemplate {
		t.Fatalf("created: %v", got)
	}
	// Invalid specs name the field; nothing is stored.
	bad := capiPreviewPolicy()
	bad.Name = "other"
	bad.References[0].NameTemplate = "{{ .source.metadata.name"
	if _, err := create(bad); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "policy.references[0].name_template") {
		t.Fatalf("bad template: %v", err)
	}
	// One policy per source: a second for clusters.cluster.x-k8s.io on mgmt names the first.
	second := capiPreviewPolicy()
	second.Name = "capi-2"
	if _, err := create(second); connect.CodeOf(err) != connect.CodeAlreadyExists || !strings.Contains(err.Error(), `"capi"`) {
		t.Fatalf("second policy of a source: %v", err)
	}
	if _, err := create(capiPreviewPolicy()); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("same name twice: %v", err)
	}
	// Update with the revision read; a stale revision is Aborted.
	upd := capiPreviewPolicy()
	upd.CreationCondition = "true"
	res, err := c.UpdateImportPolicy(ctx, connect.NewRequest(&clusterv1.UpdateImportPolicyRequest{Policy: upd, ExpectedRevision: got.Revision}))
	if err != nil || res.Msg.Policy.CreationCondition != "true" || res.Msg.Policy.Revision <= got.Revision {
		t.Fatalf("update: %v %v", res, err)
	}
	same, err := c.UpdateImportPolicy(ctx, connect.NewRequest(&clusterv1.UpdateImportPolicyRequest{Policy: upd}))
	if err != nil || same.Msg.Policy.Revision != res.Msg.Policy.Revision {
		t.Fatalf("an update that changes nothing appends nothing: %v %v", same, err)
	}
	upd.Template = "labels: {a: b}\n"
	if _, err := c.UpdateImportPolicy(ctx, connect.NewRequest(&clusterv1.UpdateImportPolicyRequest{Policy: upd, ExpectedRevision: got.Revision})); connect.CodeOf(err) != connect.CodeAborted {
		t.Fatalf("stale revision: %v", err)
	}
	// Deleting frees the source for another policy.
	if _, err := c.DeleteImportPolicy(ctx, connect.NewRequest(&clusterv1.DeleteImportPolicyRequest{Name: "capi"})); err != nil {
		t.Fatal(err)
	}
	if _, err := create(second); err != nil {
		t.Fatalf("the source after its policy was deleted: %v", err)
	}
	list, err := c.ListImportPolicies(ctx, connect.NewRequest(&clusterv1.ListImportPoliciesRequest{}))
	if err != nil || len(list.Msg.Policies) != 1 || list.Msg.Policies[0].Name != "capi-2" {
		t.Fatalf("list: %v %v", list, err)
	}
	// A restarted service (same stream) shows the same policies.
	e.stop()
	e2 := start(t, j, clusterimport.Config{})
	c2 := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e2.url)
	g, err := c2.GetImportPolicy(ctx, connect.NewRequest(&clusterv1.GetImportPolicyRequest{Name: "capi-2"}))
	if err != nil || !proto.Equal(g.Msg.Policy, list.Msg.Policies[0]) {
		t.Fatalf("after restart: %v %v", g, err)
	}
	if _, err := c2.GetImportPolicy(ctx, connect.NewRequest(&clusterv1.GetImportPolicyRequest{Name: "capi"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("deleted policy after restart: %v", err)
	}
}

// withPlantedClaim starts the service with cluster mgmt registered, and claims the source of
// capiPreviewPolicy for policy owner, which has no event: as a create between its claim and
// its event leaves it. It returns a client, the claims bucket and the claim's key.
func withPlantedClaim(ctx context.Context, t *testing.T, cfg clusterimport.Config, owner string) (clusterv1connect.ImportPolicyServiceClient, jetstream.KeyValue, string) {
	t.Helper()
	e := start(t, nil, cfg)
	c := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	register(t, e, "mgmt", nil)
	kv, err := e.js.JS.KeyValue(ctx, subjects.ImportPolicySourcesBucket)
	if err != nil {
		t.Fatal(err)
	}
	key := keys.Join("mgmt", "cluster.x-k8s.io", "clusters")
	if _, err := kv.Create(ctx, key, []byte(owner)); err != nil {
		t.Fatal(err)
	}
	return c, kv, key
}

// A claim on a source whose policy has no event yet is a create in flight (its claim comes
// before its event): another policy for that source is refused, not handed the source. (Before,
// such a claim was taken over as a crashed create's, and two policies imported one source.)
func TestInFlightClaimOfASourceIsNotTakenOver(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	c, _, _ := withPlantedClaim(ctx, t, clusterimport.Config{}, "in-flight")
	_, err := c.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: capiPreviewPolicy()}))
	if connect.CodeOf(err) != connect.CodeAlreadyExists || !strings.Contains(err.Error(), `"in-flight"`) {
		t.Fatalf("a policy for a source claimed by a create in flight: %v", err)
	}
}

// A claim whose create died between claim and event (no event for its policy) is taken over
// once it is older than PolicyClaimGrace.
func TestAbandonedClaimOfASourceIsTakenOverAfterTheGrace(t *testing.T) {
	ctx := testkit.Context(t, 30*time.Second)
	c, kv, key := withPlantedClaim(ctx, t, clusterimport.Config{PolicyClaimGrace: 3 * time.Second}, "died")
	create := func() error {
		_, err := c.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: capiPreviewPolicy()}))
		return err
	}
	if err := create(); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("within the grace: %v", err)
	}
	time.Sleep(3500 * time.Millisecond)
	if err := create(); err != nil {
		t.Fatalf("past the grace: %v", err)
	}
	if e, err := kv.Get(ctx, key); err != nil || string(e.Value()) != "capi" {
		t.Fatalf("the claim after the takeover: %v", err)
	}
}

func TestConcurrentPoliciesOfOneSourceExactlyOneWins(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	c := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	register(t, e, "mgmt", nil)
	testkit.OneWins(t, 6, connect.CodeAlreadyExists, func(i int) error {
		p := capiPreviewPolicy()
		p.Name = fmt.Sprintf("capi-%d", i)
		_, err := c.CreateImportPolicy(context.Background(), connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: p}))
		return err
	})
}
