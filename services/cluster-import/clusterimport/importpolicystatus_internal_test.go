package clusterimport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetstream/fleetstream/pkg/events"
	agentv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/agent/v1"
	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/subjects"
)

func TestPolicyStatus(t *testing.T) {
	const (
		yes     = clusterv1.ConditionStatus_CONDITION_STATUS_TRUE
		no      = clusterv1.ConditionStatus_CONDITION_STATUS_FALSE
		unknown = clusterv1.ConditionStatus_CONDITION_STATUS_UNKNOWN
	)
	policy := func(group, resource string, refs ...string) *clusterv1.ImportPolicy {
		p := &clusterv1.ImportPolicy{Name: "capi", Source: &clusterv1.ImportSource{Cluster: "mgmt", Group: group, Resource: resource}}
		for _, r := range refs {
			p.References = append(p.References, &clusterv1.ImportReference{Key: r, Version: "v1", Resource: r})
		}
		return p
	}
	capi := policy("cluster.x-k8s.io", "clusters", "secrets")
	since := timestamppb.New(time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC))
	agent := func(types ...*agentv1.WatchedTypeStatus) *agentWatchStatus {
		a := &agentWatchStatus{types: map[watchTypeKey]*agentv1.WatchedTypeStatus{}}
		for _, t := range types {
			t.Since = since
			a.types[watchTypeKey{t.Source, t.Group, t.Resource, t.Namespace}] = t
		}
		return a
	}
	source := func(version, reason, msg string, synced bool) *agentv1.WatchedTypeStatus {
		return &agentv1.WatchedTypeStatus{Group: "cluster.x-k8s.io", Resource: "clusters", Source: true, Version: version, Reason: reason, Message: msg, Synced: synced}
	}
	lifecycle := func(name string, mode clusterv1.ImportMode, refs clusterv1.ConditionStatus) *clusterv1.ImportLifecycle {
		return &clusterv1.ImportLifecycle{Source: &clusterv1.ImportSourceRef{Namespace: "capi", Name: name}, Mode: mode,
			Conditions: []*clusterv1.Condition{{Type: "ReferencesResolved", Status: refs, Reason: "ReferenceNotFound", Message: "secret missing"}}}
	}
	type want struct {
		status       clusterv1.ConditionStatus
		reason, text string
	}
	for _, tc := range []struct {
		name                      string
		policy                    *clusterv1.ImportPolicy
		in                        policyInputs
		validated, watched, refs  want
		sources, lcs, made, taken int32
	}{
		{
			name:      "no report from the agent yet",
			policy:    capi,
			validated: want{unknown, "WaitingForAgent", `agent of cluster "mgmt" has not reported on clusters.cluster.x-k8s.io`},
			watched:   want{unknown, "WaitingForAgent", ""},
			refs:      want{unknown, "NoLifecycles", ""},
		},
		{
			name:   "the agent reports on other types only",
			policy: capi,
			in: policyInputs{agent: agent(&agentv1.WatchedTypeStatus{Group: "cluster.x-k8s.io", Resource: "clusters", Namespace: "other", Source: true, Version: "v1beta1", Synced: true},
				&agentv1.WatchedTypeStatus{Group: "example.io", Resource: "clusters", Source: true, Reason: "NotServed", Message: "no matches"})},
			validated: want{unknown, "WaitingForAgent", ""},
			watched:   want{unknown, "WaitingForAgent", ""},
			refs:      want{unknown, "NoLifecycles", ""},
		},
		{
			name:      "the source type is not served",
			policy:    capi,
			in:        policyInputs{agent: agent(source("", "NotServed", `no matches for cluster.x-k8s.io/, Resource=clusters`, false))},
			validated: want{no, "FailedNegotiateSourceResource", `cluster "mgmt" does not serve clusters.cluster.x-k8s.io: no matches for cluster.x-k8s.io/, Resource=clusters`},
			watched:   want{no, "NotServed", "no matches"},
			refs:      want{unknown, "NoLifecycles", ""},
		},
		{
			name:      "served but forbidden",
			policy:    capi,
			in:        policyInputs{agent: agent(source("v1beta1", "Forbidden", `clusters.cluster.x-k8s.io is forbidden: User "system:serviceaccount:fleet:agent" cannot list`, false))},
			validated: want{yes, "Validated", "version v1beta1"},
			watched:   want{no, "Forbidden", `cannot watch clusters.cluster.x-k8s.io: clusters.cluster.x-k8s.io is forbidden`},
			refs:      want{unknown, "NoLifecycles", ""},
		},
		{
			name:      "discovery failed: not known whether served",
			policy:    capi,
			in:        policyInputs{agent: agent(source("", "WatchFailed", "the server is currently unable to handle the request", false))},
			validated: want{unknown, "WatchFailed", "unable to handle"},
			watched:   want{no, "WatchFailed", "unable to handle"},
			refs:      want{unknown, "NoLifecycles", ""},
		},
		{
			name:      "listing",
			policy:    capi,
			in:        policyInputs{agent: agent(source("v1beta1", "", "", false))},
			validated: want{yes, "Validated", ""},
			watched:   want{unknown, "Syncing", ""},
			refs:      want{unknown, "NoLifecycles", ""},
		},
		{
			name:   "watched, every lifecycle resolved",
			policy: capi,
			in: policyInputs{agent: agent(source("v1beta1", "", "", true)), sourceObjects: 3, lifecycles: []*clusterv1.ImportLifecycle{
				lifecycle("a", clusterv1.ImportMode_IMPORT_MODE_CREATED, yes), lifecycle("b", clusterv1.ImportMode_IMPORT_MODE_ADOPTED, yes)}},
			validated: want{yes, "Validated", ""},
			watched:   want{yes, "Watched", ""},
			refs:      want{yes, "Resolved", "2 lifecycles"},
			sources:   3, lcs: 2, made: 1, taken: 1,
		},
		{
			name:   "a lifecycle misses its reference",
			policy: capi,
			in: policyInputs{agent: agent(source("v1beta1", "", "", true)), sourceObjects: 2, lifecycles: []*clusterv1.ImportLifecycle{
				lifecycle("a", clusterv1.ImportMode_IMPORT_MODE_CREATED, yes), lifecycle("b", clusterv1.ImportMode_IMPORT_MODE_UNSPECIFIED, no)}},
			validated: want{yes, "Validated", ""},
			watched:   want{yes, "Watched", ""},
			refs:      want{no, "ReferencesNotResolved", "1 of 2 lifecycles cannot resolve their references; first capi/b: ReferenceNotFound: secret missing"},
			sources:   2, lcs: 2, made: 1,
		},
		{
			name:   "the agent may not watch the referenced type",
			policy: capi,
			in: policyInputs{agent: agent(source("v1beta1", "", "", true),
				&agentv1.WatchedTypeStatus{Resource: "secrets", Namespace: "capi", Version: "v1", Reason: "Forbidden", Message: `secrets is forbidden`}),
				sourceObjects: 1, lifecycles: []*clusterv1.ImportLifecycle{lifecycle("a", clusterv1.ImportMode_IMPORT_MODE_UNSPECIFIED, no)}},
			validated: want{yes, "Validated", ""},
			watched:   want{yes, "Watched", ""},
			refs:      want{no, "Forbidden", `cluster "mgmt" cannot watch secrets in namespace capi: secrets is forbidden`},
			sources:   1, lcs: 1,
		},
		{
			name:      "no references",
			policy:    policy("cluster.x-k8s.io", "clusters"),
			in:        policyInputs{agent: agent(source("v1beta1", "", "", true))},
			validated: want{yes, "Validated", ""},
			watched:   want{yes, "Watched", ""},
			refs:      want{yes, "NoReferences", ""},
		},
		{
			name:      "the policy does not compile",
			policy:    capi,
			in:        policyInputs{compileErr: errors.New("template: unexpected EOF")},
			validated: want{no, "InvalidPolicy", "unexpected EOF"},
			watched:   want{no, "InvalidPolicy", ""},
			refs:      want{unknown, "NoLifecycles", ""},
		},
		{
			name:      "core Secrets as the source",
			policy:    policy("", "secrets"),
			validated: want{no, "UnsupportedSource", "Secrets cannot be an import source"},
			watched:   want{no, "UnsupportedSource", ""},
			refs:      want{yes, "NoReferences", ""},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := policyStatus(tc.policy, tc.in)
			if len(st.Conditions) != 3 {
				t.Fatalf("conditions %v", st.Conditions)
			}
			for i, w := range []want{tc.validated, tc.watched, tc.refs} {
				c := st.Conditions[i]
				if wantType := []string{"Validated", "SourceWatched", "ReferencesResolved"}[i]; c.Type != wantType {
					t.Errorf("condition %d is %s, want %s", i, c.Type, wantType)
				}
				if c.Status != w.status || c.Reason != w.reason || !strings.Contains(c.Message, w.text) {
					t.Errorf("%s = %s %s %q, want %s %s containing %q", c.Type, c.Status, c.Reason, c.Message, w.status, w.reason, w.text)
				}
			}
			if st.SourceObjects != tc.sources || st.Lifecycles != tc.lcs || st.ClustersCreated != tc.made || st.ClustersAdopted != tc.taken {
				t.Errorf("counts %d sources, %d lifecycles, %d created, %d adopted; want %d, %d, %d, %d",
					st.SourceObjects, st.Lifecycles, st.ClustersCreated, st.ClustersAdopted, tc.sources, tc.lcs, tc.made, tc.taken)
			}
			// What the agent reported dates the conditions it decides.
			if v := st.Conditions[0]; tc.in.agent != nil && v.Status != unknown && v.Reason != "InvalidPolicy" && !v.LastTransitionTime.AsTime().Equal(since.AsTime()) {
				t.Errorf("Validated last transition %v, want the agent's %v", v.LastTransitionTime, since)
			}
		})
	}
}

func TestCheckWatchStatus(t *testing.T) {
	now := time.Date(2026, 11, 27, 1, 0, 0, 0, time.UTC)
	entry := func(i int) *agentv1.WatchedTypeStatus {
		return &agentv1.WatchedTypeStatus{Group: "example.io", Resource: fmt.Sprintf("r%d", i), Source: true, Version: "v1", Since: timestamppb.New(now.Add(-time.Minute))}
	}
	many := &agentv1.ImportWatchStatus{ClusterName: "mgmt"}
	for i := range maxWatchStatusTypes + 10 {
		many.Types = append(many.Types, entry(i))
	}
	for _, tc := range []struct {
		name     string
		in       *agentv1.ImportWatchStatus
		kept     int
		problems int
		check    func(t *testing.T, got *agentWatchStatus)
	}{
		{name: "within bounds", in: &agentv1.ImportWatchStatus{Types: []*agentv1.WatchedTypeStatus{entry(1)}}, kept: 1},
		{name: "too many types", in: many, kept: maxWatchStatusTypes, problems: 1},
		{
			name: "an overlong message is cut, valid UTF-8",
			in: &agentv1.ImportWatchStatus{Types: []*agentv1.WatchedTypeStatus{{Resource: "r", Source: true, Reason: "Forbidden",
				Message: strings.Repeat("é", maxWatchStatusMessage)}}},
			kept: 1,
			check: func(t *testing.T, got *agentWatchStatus) {
				m := got.types[watchTypeKey{true, "", "r", ""}].Message
				if len(m) > maxWatchStatusMessage+len("…") || !utf8.ValidString(m) {
					t.Errorf("message of %d bytes, valid UTF-8 %v", len(m), utf8.ValidString(m))
				}
			},
		},
		{
			name: "an unknown reason is WatchFailed",
			in:   &agentv1.ImportWatchStatus{Types: []*agentv1.WatchedTypeStatus{{Resource: "r", Source: true, Reason: "AllFine\n<script>"}}},
			kept: 1, problems: 1,
			check: func(t *testing.T, got *agentWatchStatus) {
				if r := got.types[watchTypeKey{true, "", "r", ""}].Reason; r != "WatchFailed" {
					t.Errorf("reason %q", r)
				}
			},
		},
		{
			name: "overlong names are dropped",
			in:   &agentv1.ImportWatchStatus{Types: []*agentv1.WatchedTypeStatus{{Resource: strings.Repeat("r", 300)}, {Resource: "r", Namespace: strings.Repeat("n", 64)}}},
			kept: 0, problems: 2,
		},
		{
			name: "a time in the future is now",
			in:   &agentv1.ImportWatchStatus{Types: []*agentv1.WatchedTypeStatus{{Resource: "r", Since: timestamppb.New(now.Add(time.Hour))}}},
			kept: 1,
			check: func(t *testing.T, got *agentWatchStatus) {
				if s := got.types[watchTypeKey{false, "", "r", ""}].Since.AsTime(); !s.Equal(now) {
					t.Errorf("since %v", s)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := checkWatchStatus(tc.in, now)
			if len(got.types) != tc.kept || len(problems) != tc.problems {
				t.Fatalf("kept %d types, problems %q; want %d and %d problems", len(got.types), problems, tc.kept, tc.problems)
			}
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}

// An agent publishes only under its own cluster's subjects (NATS permissions); a report whose
// body names another cluster, or that sits on another subject than a status's, is refused.
func TestImportWatchStatusBelongsToItsSubject(t *testing.T) {
	status := func(cluster string) []byte {
		env, err := events.NewEnvelope(context.Background(), cluster, &agentv1.ImportWatchStatus{ClusterName: cluster,
			Types: []*agentv1.WatchedTypeStatus{{Group: "cluster.x-k8s.io", Resource: "clusters", Source: true, Reason: "NotServed"}}}, "system:cluster-agent:"+cluster)
		if err != nil {
			t.Fatal(err)
		}
		data, err := proto.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	for _, tc := range []struct {
		name, subject, body string
		ok                  bool
	}{
		{"its own", subjects.AgentImportWatchStatus("mgmt"), "mgmt", true},
		{"another cluster's body", subjects.AgentImportWatchStatus("mgmt"), "other", false},
		{"another subject of its own", subjects.AgentImportSync("mgmt", "x", "y", "") + ".importstatus", "mgmt", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newImportSources(func() {})
			err := r.handle(tc.subject, status(tc.body), 1)
			if got := r.watchStatusOf("mgmt") != nil || r.watchStatusOf("other") != nil; got != tc.ok || (err == nil) != tc.ok {
				t.Fatalf("stored %v, err %v; want stored %v", got, err, tc.ok)
			}
		})
	}
}
