package cli

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
)

// runFake runs fleetctl against api and returns its exit code, stdout and stderr.
func runFake(t *testing.T, api *fakeAPI, stdin string, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv(envConfig, filepath.Join(t.TempDir(), "config.yaml"))
	var out, errOut bytes.Buffer
	code := Run(context.Background(), IOStreams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut},
		append([]string{"--server", api.url, "--token", fakeToken}, args...))
	return code, out.String(), errOut.String()
}

// dryRunOf reports whether msg has a dry_run field, and its value.
func dryRunOf(msg proto.Message) (has, set bool) {
	fd := msg.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name("dry_run"))
	if fd == nil {
		return false, false
	}
	return true, msg.ProtoReflect().Get(fd).Bool()
}

// TestApplyServerDryRunOldHub: a hub from before strict JSON decoding drops an unknown field,
// so it would read a dry run as the write. fleetctl asks it first, with a read carrying a field
// no request declares, and stops before sending any dry run.
func TestApplyServerDryRunOldHub(t *testing.T) {
	api := startOldFakeAPI(t)
	api.reset(applyAnswers(), nil)
	code, out, errOut := runFake(t, api, applyStdin, "apply", "-f", "-", "--dry-run=server")
	want := "error: the hub at " + api.url + " is too old for --dry-run=server: it would ignore dry_run and write; upgrade it or use --dry-run=client\n"
	if code != 1 || errOut != want {
		t.Fatalf("server dry run against an old hub: exit %d, stderr %q, want %q\n%s", code, errOut, want, out)
	}
	var probes int
	for _, r := range api.sent() {
		if has, _ := dryRunOf(r.msg); has {
			t.Errorf("%s was sent to a hub that ignores dry_run", r.procedure)
		}
		if r.procedure == projectv1connect.ProjectServiceListProjectsProcedure && r.contentType == "application/json" {
			probes++
		}
	}
	if probes != 1 {
		t.Errorf("%d JSON ListProjects probes, want 1: %v", probes, api.sent())
	}
}

// TestApplyServerDryRunRequests: every dry run reaches the hub as JSON, whose decoding refuses
// a field the hub does not know (binary would keep dry_run unread and write), with dry_run set,
// and each is the real apply's request: a pruned project's deletion cascades only with
// --cascade, and removed budgets go in cluster order.
func TestApplyServerDryRunRequests(t *testing.T) {
	api := startFakeAPI(t)
	prod := map[string]string{partOfLabel: "prod"}
	var budgets []*projectv1.ProjectBudget
	clusters := []string{"c09", "c03", "c11", "c01", "c07", "c05", "c10", "c02", "c08", "c04", "c12", "c06"}
	for _, c := range clusters {
		budgets = append(budgets, &projectv1.ProjectBudget{Cluster: c, Hard: map[string]string{"cpu": "1"}})
	}
	answers := []proto.Message{
		&clusterv1.ListClustersResponse{Clusters: []*clusterv1.Cluster{goldenCluster("eu-1")}},
		&projectv1.ListProjectsResponse{Projects: []*projectv1.Project{
			{Name: "team-a", DisplayName: "A", Revision: 2, Labels: prod, Budgets: budgets},
			{Name: "team-x", DisplayName: "X", Revision: 4, Labels: prod},
		}},
		&projectv1.ListNamespaceBindingsResponse{},
	}
	manifest := `apiVersion: fleetstream.io/v1alpha1
kind: Cluster
metadata: {name: eu-1, labels: {env: staging}}
spec: {}
---
apiVersion: fleetstream.io/v1alpha1
kind: Project
metadata: {name: team-a}
spec: {displayName: A}
`
	for _, cascade := range []bool{false, true} {
		t.Run(fmt.Sprintf("cascade=%v", cascade), func(t *testing.T) {
			api.reset(answers, nil)
			args := []string{"apply", "-f", "-", "--applyset", "prod", "--prune", "--applyset-records", t.TempDir(), "--force-conflicts", "--dry-run=server"}
			if cascade {
				args = append(args, "--cascade")
			}
			code, out, errOut := runFake(t, api, manifest, args...)
			if code != 0 {
				t.Fatalf("exit %d\n%s%s", code, out, errOut)
			}
			var dryRuns, deletes int
			var removed []string
			for _, r := range api.sent() {
				has, set := dryRunOf(r.msg)
				if !has {
					continue
				}
				dryRuns++
				if !set || r.contentType != "application/json" {
					t.Errorf("%s sent as %s with dry_run %v, want application/json with dry_run", r.procedure, r.contentType, set)
				}
				switch m := r.msg.(type) {
				case *projectv1.DeleteProjectRequest:
					deletes++
					if m.Name != "team-x" || m.Force != cascade {
						t.Errorf("prune's dry run asked to delete project %s with force %v, want team-x with force %v (--cascade)", m.Name, m.Force, cascade)
					}
				case *projectv1.SetProjectBudgetRequest:
					removed = append(removed, m.Cluster)
				}
			}
			if dryRuns != 1+len(clusters)+1 || deletes != 1 {
				t.Errorf("%d dry runs (%d project deletions), want %d:\n%s", dryRuns, deletes, 2+len(clusters), out)
			}
			if want := slices.Sorted(slices.Values(clusters)); !slices.Equal(removed, want) {
				t.Errorf("budgets removed in the order %v, want %v (the real apply's)", removed, want)
			}
			var printed []string
			for _, line := range strings.Split(out, "\n") {
				if c, ok := strings.CutPrefix(line, "  budget on "); ok {
					printed = append(printed, strings.TrimSuffix(c, " removed"))
				}
			}
			if want := slices.Sorted(slices.Values(clusters)); !slices.Equal(printed, want) {
				t.Errorf("removed budgets printed in the order %v, want %v:\n%s", printed, want, out)
			}
		})
	}
}
