package namespacebinding

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"connectrpc.com/connect"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fleetstream/fleetstream/pkg/apierr"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/identity"
)

// Project budgets (seed 004, TKE's project quota): per cluster, a cap on the sum of the hard
// limits of the project's namespace quotas there. The budget lives in the project aggregate
// (ProjectBudgetSet on the project's subject), so a check of a bind or quota update against it
// and the append that follows are one decision on one revision of the aggregate: the append
// expects that revision, and JetStream refuses it if anything (another bind, another replica's
// budget change) was appended to the project since. See docs/namespaces.md.

func (s *ProjectAPI) SetProjectBudget(ctx context.Context, req *connect.Request[projectv1.SetProjectBudgetRequest]) (*connect.Response[projectv1.SetProjectBudgetResponse], error) {
	m := req.Msg
	var v apierr.Violations
	v.DNSLabel("project", m.Project)
	v.DNSLabel("cluster", m.Cluster)
	validateHard(&v, "hard", m.Hard)
	if err := s.gate.Admit(ctx, &v); err != nil {
		return nil, err
	}
	if _, ok := s.projects.Get(projectKey(m.Project)); !ok {
		return nil, apierr.NotFound("project", m.Project)
	}
	// Removing a budget stays possible after the cluster was deregistered.
	if len(m.Hard) > 0 {
		if err := s.clusterRegistered(ctx, m.Cluster); err != nil {
			return nil, err
		}
	}
	hard := canonicalHard(m.Hard)
	var at uint64
	var decided *projectv1.Project
	seq, err := s.projectCommand(ctx, m.Project, m.DryRun, always, func(p *projectv1.Project) (proto.Message, error) {
		at, decided = p.Revision, p
		if proto.Equal(&projectv1.ProjectBudget{Hard: budgetOf(p, m.Cluster)}, &projectv1.ProjectBudget{Hard: hard}) {
			return nil, errUnchanged
		}
		if err := s.budgetHolds(p.Name, m.Cluster, hard); err != nil {
			return nil, err
		}
		return &projectv1.ProjectBudgetSet{Project: m.Project, Cluster: m.Cluster, Hard: hard}, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		return nil, err
	}
	if m.DryRun {
		// The project as it would be: its budget on the cluster replaced, allocated as now.
		p := proto.CloneOf(decided)
		setBudget(p, m.Cluster, hard)
		return connect.NewResponse(&projectv1.SetProjectBudgetResponse{Project: s.presentProject(p)}), nil
	}
	if err := s.waitView(ctx, func(ctx context.Context) error { return s.projects.WaitCheckpoint(ctx, max(seq, at)) }); err != nil {
		return nil, err
	}
	p, ok := s.projects.Get(projectKey(m.Project))
	if !ok {
		return nil, apierr.NotFound("project", m.Project)
	}
	if seq != 0 {
		s.log.Info("project budget set", zap.String("project", m.Project), zap.String("cluster", m.Cluster),
			zap.Any("hard", hard), zap.String("actor", identity.ActorFrom(ctx)))
	}
	return connect.NewResponse(&projectv1.SetProjectBudgetResponse{Project: s.presentProject(p)}), nil
}

// budgetOf returns p's budget on cluster; nil: none, the project is unlimited there.
func budgetOf(p *projectv1.Project, cluster string) map[string]string {
	for _, b := range p.GetBudgets() {
		if b.Cluster == cluster {
			return b.Hard
		}
	}
	return nil
}

// setBudget replaces p's budget on cluster (an empty hard removes it), keeping the budgets
// ordered by cluster.
func setBudget(p *projectv1.Project, cluster string, hard map[string]string) {
	budgets := make([]*projectv1.ProjectBudget, 0, len(p.Budgets)+1)
	for _, b := range p.Budgets {
		if b.Cluster != cluster {
			budgets = append(budgets, b)
		}
	}
	if len(hard) > 0 {
		budgets = append(budgets, &projectv1.ProjectBudget{Cluster: cluster, Hard: hard})
	}
	sort.Slice(budgets, func(i, j int) bool { return budgets[i].Cluster < budgets[j].Cluster })
	if len(budgets) == 0 {
		budgets = nil
	}
	p.Budgets = budgets
}

// always and budgeted tell appendProject whether a command's build reads the bindings view
// (and must see it at the revision its append expects). A bind reads it only to sum the
// project's quotas on a budgeted cluster; elsewhere it decides nothing from the view.
func always(*projectv1.Project) bool { return true }

func budgeted(cluster string) func(*projectv1.Project) bool {
	return func(p *projectv1.Project) bool { return len(budgetOf(p, cluster)) > 0 }
}

// countedBindings returns project's bindings on cluster that count against its budget there:
// all but Terminating ones (an unbound namespace frees its share at once, as it leaves the
// project's sums) and the one at except (the binding a quota update replaces, or a key being
// bound again).
func (s *Service) countedBindings(project, cluster, except string) []*projectv1.NamespaceBinding {
	var out []*projectv1.NamespaceBinding
	for _, b := range s.bindings.Lookup(byProjectCluster(project, cluster)) {
		if b.Phase == projectv1.BindingPhase_BINDING_PHASE_TERMINATING || bindingKey(b.Cluster, b.Namespace) == except {
			continue
		}
		out = append(out, b)
	}
	return out
}

func sumHard(bindings []*projectv1.NamespaceBinding) map[string]resource.Quantity {
	sum := map[string]resource.Quantity{}
	for _, b := range bindings {
		addQuantities(sum, b.Hard)
	}
	return sum
}

// fitsBudget refuses a quota hard for namespace on cluster that project p's budget there does
// not leave room for, next to the project's other namespaces on the cluster. p is the project
// at the revision the append expects, and the bindings view has applied that revision.
//
// A namespace must set a limit for every budgeted resource (as TKE requires): a namespace
// without one could use the whole cluster and the budget would cap nothing.
func (s *Service) fitsBudget(p *projectv1.Project, cluster, namespace string, hard map[string]string) error {
	budget := budgetOf(p, cluster)
	if len(budget) == 0 {
		return nil
	}
	names := sortedNames(budget)
	var missing []string
	for _, r := range names {
		if _, ok := hard[r]; !ok {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		return apierr.FailedPrecondition("project %s budget on cluster %s limits %s: the quota of namespace %s must set %s too (a namespace without a limit could use the whole budget)",
			p.Name, cluster, strings.Join(names, ", "), namespace, strings.Join(missing, ", "))
	}
	used := sumHard(s.countedBindings(p.Name, cluster, bindingKey(cluster, namespace)))
	var over []string
	for _, r := range names {
		limit, err1 := resource.ParseQuantity(budget[r])
		ask, err2 := resource.ParseQuantity(hard[r])
		if err1 != nil || err2 != nil {
			continue // both validated on the way in
		}
		total := used[r].DeepCopy()
		total.Add(ask)
		if total.Cmp(limit) > 0 {
			left := limit.DeepCopy()
			left.Sub(used[r])
			over = append(over, fmt.Sprintf("%s asks %s, %s left of %s", r, ask.String(), left.String(), limit.String()))
		}
	}
	if len(over) > 0 {
		return apierr.FailedPrecondition("project %s budget on cluster %s: %s", p.Name, cluster, strings.Join(over, "; "))
	}
	return nil
}

// budgetHolds refuses a new budget hard of project on cluster that its namespaces there do not
// fit in already: a budget is never set below what is handed out (lowering it would not take
// anything back from the namespaces, it would only hide an overspend), and every namespace
// must already set a limit for each budgeted resource. An empty hard (no budget) always holds.
func (s *Service) budgetHolds(project, cluster string, hard map[string]string) error {
	if len(hard) == 0 {
		return nil
	}
	bindings := s.countedBindings(project, cluster, "")
	names := sortedNames(hard)
	var lacking []string
	for _, b := range bindings {
		var miss []string
		for _, r := range names {
			if _, ok := b.Hard[r]; !ok {
				miss = append(miss, r)
			}
		}
		if len(miss) > 0 {
			lacking = append(lacking, fmt.Sprintf("%s (%s)", b.Namespace, strings.Join(miss, ", ")))
		}
	}
	if len(lacking) > 0 {
		const show = 5
		more := ""
		if len(lacking) > show {
			more = fmt.Sprintf(" and %d more", len(lacking)-show)
			lacking = lacking[:show]
		}
		return apierr.FailedPrecondition("project %s budget on cluster %s: namespaces without a limit for a budgeted resource: %s%s; give their quotas one first",
			project, cluster, strings.Join(lacking, ", "), more)
	}
	used := sumHard(bindings)
	var over []string
	for _, r := range names {
		limit, err := resource.ParseQuantity(hard[r])
		if err != nil {
			continue // validated on the way in
		}
		if u := used[r]; u.Cmp(limit) > 0 {
			over = append(over, fmt.Sprintf("%s %s is below the %s its namespaces hold", r, limit.String(), u.String()))
		}
	}
	if len(over) > 0 {
		return apierr.FailedPrecondition("project %s budget on cluster %s: %s; lower their quotas or unbind namespaces first",
			project, cluster, strings.Join(over, "; "))
	}
	return nil
}

// presentBudgets returns p's budgets with what each resource has handed out: perCluster is the
// sum of the hard limits of the project's counted namespaces per cluster.
func presentBudgets(budgets []*projectv1.ProjectBudget, perCluster map[string]map[string]resource.Quantity) []*projectv1.ProjectBudget {
	out := make([]*projectv1.ProjectBudget, 0, len(budgets))
	for _, b := range budgets {
		pb := &projectv1.ProjectBudget{Cluster: b.Cluster, Hard: canonicalHard(b.Hard), Allocated: make(map[string]string, len(b.Hard))}
		sums := perCluster[b.Cluster]
		for r := range b.Hard {
			q := sums[r]
			pb.Allocated[r] = q.String()
		}
		out = append(out, pb)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// budgetAfter is p's budget on cluster as it would be allocated once namespace there holds hard
// (a dry run's answer); nil when p has no budget on cluster.
func (s *Service) budgetAfter(p *projectv1.Project, cluster, namespace string, hard map[string]string) *projectv1.ProjectBudget {
	budget := budgetOf(p, cluster)
	if len(budget) == 0 {
		return nil
	}
	used := sumHard(s.countedBindings(p.Name, cluster, bindingKey(cluster, namespace)))
	addQuantities(used, hard)
	return presentBudgets([]*projectv1.ProjectBudget{{Cluster: cluster, Hard: budget}}, map[string]map[string]resource.Quantity{cluster: used})[0]
}

func sortedNames(m map[string]string) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}
