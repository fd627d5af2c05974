package clusterimport_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// lifecycleCondition returns the condition typ of the lifecycle of source object src.
func lifecycleCondition(ctx context.Context, pc clusterv1connect.ImportPolicyServiceClient, src, typ string) (*clusterv1.Condition, error) {
	res, err := pc.ListImportLifecycles(ctx, connect.NewRequest(&clusterv1.ListImportLifecyclesRequest{Policy: "capi"}))
	if err != nil {
		return nil, err
	}
	for _, lc := range res.Msg.Lifecycles {
		if lc.Source.GetName() != src {
			continue
		}
		for _, c := range lc.Conditions {
			if c.Type == typ {
				return c, nil
			}
		}
		return nil, fmt.Errorf("%s: no condition %s in %v", src, typ, lc.Conditions)
	}
	return nil, fmt.Errorf("no lifecycle for %s", src)
}

// TestAdoptionNeverTakesOverACluster performs the attack of issue 25 item 3: an import source
// (whose Secret a tenant may write) renders the name of a cluster registered by hand, with
// credentials. The adoption must not give that cluster the Secret's credentials when its own
// agent has connected or it has credentials of its own; a platform admin's label allows it;
// a cluster registered by hand with neither still gets them. Credentials an import attached
// go when its lifecycle ends.
func TestAdoptionNeverTakesOverACluster(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, clusterimport.Config{})
	ctx := testkit.Context(t, 3*time.Minute)
	pc := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	get := func(name string) (*clusterv1.Cluster, error) {
		res, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: name}))
		if err != nil {
			return nil, err
		}
		return res.Msg.Cluster, nil
	}
	register(t, e, "mgmt", nil)

	// c1: registered by hand; its own agent connected.
	register(t, e, "c1", map[string]string{"owner": "ops"})
	// c2: registered by hand with its own credentials.
	own := &clusterv1.ConnectionCredentials{Server: "https://c2.internal:6443", Token: "c2-own-token-0123456789"}
	if _, err := e.client.RegisterCluster(ctx, connect.NewRequest(&clusterv1.RegisterClusterRequest{Name: "c2", Credentials: own})); err != nil {
		t.Fatal(err)
	}
	// c3: as c1, but a platform admin allows an import to give it credentials.
	register(t, e, "c3", map[string]string{clusterimport.LabelAllowImportCredentials: "true"})
	// c4: registered by hand, no credentials, no agent yet: it may receive them, as before.
	register(t, e, "c4", nil)
	heartbeat(t, j.JS, "c1", "v1.31.0")
	heartbeat(t, j.JS, "c3", "v1.31.0")
	testkit.Eventually(t, 10*time.Second, func() error {
		for _, n := range []string{"c1", "c3"} {
			c, err := get(n)
			if err != nil {
				return err
			}
			if hasTaint(c, clusterimport.TaintUnreachable) {
				return fmt.Errorf("%s: agent not connected yet", n)
			}
		}
		return nil
	})

	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: lifecyclePolicy()})); err != nil {
		t.Fatal(err)
	}
	inv := &fakeInventory{t: t, j: j, store: events.NewStore(j.JS, "system:cluster-agent:mgmt"), cluster: "mgmt"}
	for _, n := range []string{"c1", "c2", "c3", "c4"} {
		inv.source(n, true, nil, nil)
	}
	// The Secrets are sent until every lifecycle has read its own: the agent's watch of them
	// follows the sources' first renders.
	want := map[string]string{"c1": "AgentConnected", "c2": "ClusterHasCredentials", "c3": "Attached", "c4": "Attached"}
	testkit.Eventually(t, 30*time.Second, func() error {
		for _, n := range []string{"c1", "c2", "c3", "c4"} {
			inv.secret(n+"-kubeconfig", kubeconfigFor("https://attacker.example:6443", "tenant-token-for-"+n))
		}
		for n, reason := range want {
			c, err := lifecycleCondition(ctx, pc, n, clusterimport.ConditionCredentials)
			if err != nil {
				return err
			}
			if c.Reason != reason {
				return fmt.Errorf("%s: %s %s (%s), want %s", n, c.Type, c.Reason, c.Message, reason)
			}
		}
		return nil
	})
	if c, _ := lifecycleCondition(ctx, pc, "c1", clusterimport.ConditionCredentials); c.Status != clusterv1.ConditionStatus_CONDITION_STATUS_FALSE ||
		!strings.Contains(c.Message, clusterimport.LabelAllowImportCredentials) {
		t.Errorf("c1's condition: %v", c)
	}
	if err := e.svc.WaitImportPass(ctx, inv.seq, 0); err != nil {
		t.Fatal(err)
	}
	for n, wantToken := range map[string]string{"c1": "", "c2": own.Token, "c3": "tenant-token-for-c3", "c4": "tenant-token-for-c4"} {
		creds, err := e.svc.Credentials(ctx, n)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		switch {
		case wantToken == "" && creds != nil:
			t.Errorf("%s was given credentials", n)
		case wantToken == own.Token && creds.GetToken() != own.Token:
			t.Errorf("%s's own credentials were replaced", n)
		case wantToken != "" && wantToken != own.Token && !strings.Contains(string(creds.GetKubeconfig()), wantToken):
			t.Errorf("%s did not get the rendered credentials", n)
		}
		c, err := get(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.AdoptedBy) != 1 {
			t.Errorf("%s not adopted: %v", n, c)
		}
	}

	// A rotated Secret rotates what the import attached, even now that a (hosted) agent of c4
	// connected with them.
	heartbeat(t, j.JS, "c4", "v1.31.0")
	inv.secret("c4-kubeconfig", kubeconfigFor("https://attacker.example:6443", "rotated-tenant-token-for-c4"))
	testkit.Eventually(t, 20*time.Second, func() error {
		creds, err := e.svc.Credentials(ctx, "c4")
		if err != nil {
			return err
		}
		if !strings.Contains(string(creds.GetKubeconfig()), "rotated-tenant-token-for-c4") {
			return errors.New("c4's credentials not rotated yet")
		}
		return nil
	})

	// The source of c4 goes: c4 stays, without the credentials the import attached.
	inv.report(&agentv1.ImportObject{Name: "c4", Deleted: true})
	testkit.Eventually(t, 20*time.Second, func() error {
		c, err := get("c4")
		if err != nil {
			return err
		}
		if len(c.AdoptedBy) != 0 || c.Status.CredentialsSet {
			return fmt.Errorf("c4: adopted by %v, credentials set %v", c.AdoptedBy, c.Status.CredentialsSet)
		}
		return nil
	})
	if creds, err := e.svc.Credentials(ctx, "c4"); err != nil || creds != nil {
		t.Errorf("c4's credentials after its import ended: %v", err)
	}

	// The policy goes: c3 loses the credentials the import attached; c2 keeps its own.
	if _, err := pc.DeleteImportPolicy(ctx, connect.NewRequest(&clusterv1.DeleteImportPolicyRequest{Name: "capi"})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, func() error {
		for _, n := range []string{"c1", "c2", "c3"} {
			c, err := get(n)
			if err != nil {
				return err
			}
			if len(c.AdoptedBy) != 0 || c.Status.CredentialsSet != (n == "c2") {
				return fmt.Errorf("%s: adopted by %v, credentials set %v", n, c.AdoptedBy, c.Status.CredentialsSet)
			}
		}
		return nil
	})
	if creds, err := e.svc.Credentials(ctx, "c2"); err != nil || creds.GetToken() != own.Token {
		t.Errorf("c2's own credentials: %v", err)
	}
}

// TestAnImportNeverRendersTheAllowLabel: the label that lets imports replace credentials is a
// platform admin's; a policy rendering it creates nothing.
func TestAnImportNeverRendersTheAllowLabel(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, clusterimport.Config{})
	ctx := testkit.Context(t, time.Minute)
	pc := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	register(t, e, "mgmt", nil)
	pol := lifecyclePolicy()
	pol.Template = strings.Replace(pol.Template, "provider: capi", `provider: capi
  fleetstream.io/allow-import-credentials: "true"`, 1)
	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: pol})); err != nil {
		t.Fatal(err)
	}
	inv := &fakeInventory{t: t, j: j, store: events.NewStore(j.JS, "system:cluster-agent:mgmt"), cluster: "mgmt"}
	inv.source("c5", true, nil, nil)
	testkit.Eventually(t, 20*time.Second, func() error {
		inv.secret("c5-kubeconfig", kubeconfigFor("https://c5.example:6443", "token-of-c5-0123456789"))
		c, err := lifecycleCondition(ctx, pc, "c5", "Rendered")
		if err != nil {
			return err
		}
		if c.Reason != "InvalidCluster" || !strings.Contains(c.Message, clusterimport.LabelAllowImportCredentials) {
			return fmt.Errorf("c5: %v", c)
		}
		return nil
	})
	if _, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c5"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("c5 was created: %v", err)
	}
}

// TestSecretDerivedClaimsNeverReachAnEvent performs the attack of issue 25 item 7 through the
// import path: claims computed from the referenced Secret's token (hex, upper case, a 15-byte
// chunk). The lifecycle shows the refusal on the field, nothing is registered, and no stream
// holds the token in any of those forms.
func TestSecretDerivedClaimsNeverReachAnEvent(t *testing.T) {
	j := testkit.StartJetStream(t)
	e := start(t, j, clusterimport.Config{})
	ctx := testkit.Context(t, time.Minute)
	pc := clusterv1connect.NewImportPolicyServiceClient(testkit.BearerClient(http.DefaultClient, testToken), e.url)
	register(t, e, "mgmt", nil)
	pol := lifecyclePolicy()
	pol.Template = `{{ $t := .references.kubeconfig.data.value | b64dec | regexFind "token: .*" | trimPrefix "token: " }}
labels:
  provider: capi
claims:
  hex: '{{ printf "%x" $t }}'
  up: '{{ upper $t }}'
  chunk: '{{ substr 0 15 $t }}'
credentials:
  kubeconfig: "{{ .references.kubeconfig.data.value }}"
`
	if _, err := pc.CreateImportPolicy(ctx, connect.NewRequest(&clusterv1.CreateImportPolicyRequest{Policy: pol})); err != nil {
		t.Fatal(err)
	}
	const token = "tenant-secret-token-0123456789abcdef"
	inv := &fakeInventory{t: t, j: j, store: events.NewStore(j.JS, "system:cluster-agent:mgmt"), cluster: "mgmt"}
	inv.source("c6", true, nil, nil)
	// Until the lifecycle has rendered with the Secret: refused, or (without the rule) created.
	var rendered *clusterv1.Condition
	testkit.Eventually(t, 20*time.Second, func() error {
		inv.secret("c6-kubeconfig", kubeconfigFor("https://c6.example:6443", token))
		c, err := lifecycleCondition(ctx, pc, "c6", "Rendered")
		if err != nil {
			return err
		}
		if c.Reason == "ReferenceNotFound" || c.Status == clusterv1.ConditionStatus_CONDITION_STATUS_UNKNOWN {
			return fmt.Errorf("c6: %v", c)
		}
		rendered = c
		return nil
	})
	if err := e.svc.WaitImportPass(ctx, inv.seq, 0); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if rendered.Reason != "SecretDerived" || !strings.Contains(rendered.Message, "template: claims[") {
			t.Errorf("c6's Rendered condition: %v", rendered)
		}
		if _, err := e.client.GetCluster(ctx, connect.NewRequest(&clusterv1.GetClusterRequest{Name: "c6"})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("c6 was created: %v", err)
		}
	}()
	forms := []string{token, fmt.Sprintf("%x", token), strings.ToUpper(token), token[:15]}
	for name := range j.JS.StreamNames(ctx).Name() {
		s, err := j.JS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue // deleted
			}
			for _, f := range forms {
				if strings.Contains(string(m.Data), f) || strings.Contains(fmt.Sprint(m.Header), f) {
					t.Errorf("stream %s, message %d (%s) holds %q", name, seq, m.Subject, f)
				}
			}
		}
	}
}
