package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/services/fleetctl/manifest"
)

// exitError ends fleetctl with code: diff's 1 for "there are differences", which is no failure
// to print. err, when set, is printed as any error is.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

const applyExample = `  # fleet.yaml
  apiVersion: fleetstream.io/v1alpha1
  kind: Cluster
  metadata:
    name: eu-1
    labels: {region: eu}
  spec:
    claims: {cloud: aws}
  ---
  apiVersion: fleetstream.io/v1alpha1
  kind: Project
  metadata: {name: team-a}
  spec:
    displayName: Team A
    budgets:
    - cluster: eu-1
      hard: {cpu: "8"}
  ---
  apiVersion: fleetstream.io/v1alpha1
  kind: NamespaceBinding
  metadata: {name: web, project: team-a}
  spec:
    cluster: eu-1
    hard: {cpu: "2"}

  fleetctl apply -f fleet.yaml --token-dir ./agent-tokens
  fleetctl apply -f fleet/            # every .yaml, .yml and .json below fleet/
  fleetctl export | fleetctl apply -f - --dry-run
  fleetctl apply -f fleet/ --token-dir ./agent-tokens --dry-run=server   # what each service would do, or refuse`

// manifestFlags are the flags of the commands that read manifests.
type manifestFlags struct {
	files []string
}

func (m *manifestFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringArrayVarP(&m.files, "filename", "f", nil, "manifest file, directory (read recursively) or - for standard input; repeatable")
}

func (m *manifestFlags) read(f *factory) ([]*manifest.Object, error) {
	if len(m.files) == 0 {
		return nil, errors.New("--filename (-f) is required")
	}
	return manifest.Read(m.files, f.streams.In)
}

// plannedObject is one declared object and what applying it does.
type plannedObject struct {
	obj *manifest.Object
	// level orders apply: every object of a lower level is applied before any of a higher
	// one. It is the kind's rank, and among role templates the depth of inheritance, since a
	// template can inherit only from one that exists.
	level   int
	live    *liveObject
	outcome string
	err     error
	// conflicts are the fields apply would take from another writer (--force-conflicts).
	conflicts []fieldConflict
}

// plan reads the fleet and decides, for every declared object, what apply would do. Objects
// of a project that is neither declared nor in the fleet are refused here, rather than by the
// API halfway through.
func plan(ctx context.Context, f *factory, objs []*manifest.Object, tokenDir, applySet string, prune bool, own *ownership) ([]*plannedObject, *fleetState, error) {
	want := map[string]bool{"Project": true}
	for _, o := range objs {
		want[o.Kind.Name] = true
	}
	if own != nil {
		// The set's labelled clusters and projects tell a lost record from a first apply.
		want["Cluster"] = true
	}
	if prune {
		// Every kind: what the manifests no longer declare is in any of them. Service weights
		// are never pruned (no labels), so read only when declared, and then as a wanted kind:
		// a hub that cannot list them is an error before anything is written, not a fleet
		// without weights.
		declared := want["ServiceWeights"]
		want = map[string]bool{}
		for _, k := range manifest.Kinds() {
			want[k.Name] = k.Name != "ServiceWeights" || declared
		}
	}
	state, err := readFleet(ctx, f, want, "")
	if err != nil {
		return nil, nil, err
	}
	objs = withApplySetLabel(objs, state, applySet)
	declaredProjects := map[string]bool{}
	for _, o := range objs {
		if o.Kind.Name == "Project" {
			declaredProjects[o.Name] = true
		}
	}
	out := make([]*plannedObject, len(objs))
	for i, o := range objs {
		p := &plannedObject{obj: o, live: state.byKey[o.Key()]}
		if o.Kind.Project && !declaredProjects[o.Project] && state.byKey["Project/"+o.Project] == nil {
			p.err = fmt.Errorf("project %s is neither declared nor in the fleet", o.Project)
		} else {
			p.outcome, p.err = planObject(o, p.live, tokenDir)
		}
		if p.err == nil && p.outcome == outcomeConfigured && own != nil {
			if p.conflicts, err = own.conflicts(o, p.live); err != nil {
				return nil, nil, err
			}
		}
		out[i] = p
	}
	depth := inheritanceDepths(objs)
	for _, p := range out {
		p.level = p.obj.Kind.Rank * 1000
		if p.obj.Kind.Name == "RoleTemplate" {
			p.level += depth[p.obj.Name]
		}
	}
	// Apply order: by level, then as declared.
	slices.SortStableFunc(out, func(a, b *plannedObject) int { return a.level - b.level })
	return out, state, nil
}

// partOfLabel marks the clusters and projects of an apply set, as kubectl's
// applyset.kubernetes.io/part-of does (KEP-3659). Objects of a project belong to the set of
// their project; role templates, cluster sets, subscribers and import policies carry no labels
// in the API, so no set owns
// them and prune leaves them alone.
const partOfLabel = "applyset.fleetstream.io/part-of"

// withApplySetLabel gives the declared clusters and projects the label of applySet; without
// one, the label they carry in the fleet, so an apply without --applyset neither removes nor
// changes it.
func withApplySetLabel(objs []*manifest.Object, state *fleetState, applySet string) []*manifest.Object {
	out := make([]*manifest.Object, len(objs))
	for i, o := range objs {
		out[i] = o
		if !o.Kind.Labels {
			continue
		}
		value := applySet
		if value == "" {
			live := state.byKey[o.Key()]
			if live == nil || live.obj.Labels[partOfLabel] == "" {
				continue
			}
			value = live.obj.Labels[partOfLabel]
		}
		c := *o
		c.Labels = maps.Clone(o.Labels)
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		c.Labels[partOfLabel] = value
		out[i] = &c
	}
	return out
}

// prunable returns the objects of applySet the manifests no longer declare, in delete order
// (bindings before projects before clusters): clusters and projects labelled as the set's, and
// whatever belongs to a project of the set or to a project the manifests declare. A project
// that would go while holding namespaces is refused unless cascade, which deletes them with it.
func prunable(objs []*manifest.Object, state *fleetState, applySet string, cascade bool) ([]*liveObject, []error) {
	declared := map[string]bool{}
	projects := map[string]bool{}
	for _, o := range objs {
		declared[o.Key()] = true
		if o.Kind.Name == "Project" {
			projects[o.Name] = true
		}
	}
	for _, k := range state.keys {
		l := state.byKey[k].obj
		if l.Kind.Name == "Project" && l.Labels[partOfLabel] == applySet {
			projects[l.Name] = true
		}
	}
	namespaces := map[string]int{}
	for _, k := range state.keys {
		if l := state.byKey[k].obj; l.Kind.Name == "NamespaceBinding" {
			namespaces[l.Project]++
		}
	}
	var out []*liveObject
	var errs []error
	for _, k := range state.keys {
		live := state.byKey[k]
		l := live.obj
		if declared[k] {
			continue
		}
		member := false
		switch {
		case l.Kind.Project:
			member = projects[l.Project]
		case l.Kind.Labels:
			member = l.Labels[partOfLabel] == applySet
		}
		if !member {
			continue
		}
		if l.Kind.Name == "Project" && namespaces[l.Name] > 0 && !cascade {
			errs = append(errs, fmt.Errorf("%s: prune would delete the project with its %d namespace binding(s); give --cascade to unbind them with it", k, namespaces[l.Name]))
			continue
		}
		out = append(out, live)
	}
	slices.SortStableFunc(out, func(a, b *liveObject) int { return b.obj.Kind.Rank - a.obj.Kind.Rank })
	return out, errs
}

// inheritanceDepths gives each declared role template the length of its longest chain of
// declared templates it inherits from (0 for none). Decoding has refused cycles.
func inheritanceDepths(objs []*manifest.Object) map[string]int {
	inherits := map[string][]string{}
	for _, o := range objs {
		if t, ok := o.Spec.(*rbacv1.RoleTemplate); ok {
			inherits[o.Name] = t.Inherits
		}
	}
	depth := map[string]int{}
	var visit func(string, int) int
	visit = func(n string, guard int) int {
		if d, ok := depth[n]; ok || guard > len(inherits) {
			return d
		}
		d := 0
		for _, m := range inherits[n] {
			if _, declared := inherits[m]; declared {
				d = max(d, visit(m, guard+1)+1)
			}
		}
		depth[n] = d
		return d
	}
	for n := range inherits {
		visit(n, 0)
	}
	return depth
}

func newApplyCommand(f *factory) *cobra.Command {
	var (
		mf             manifestFlags
		tokenDir       string
		dryRun         string
		concurrency    int
		prune          bool
		cascade        bool
		applySet       string
		forceConflicts bool
		recordDir      string
	)
	cmd := &cobra.Command{
		Use:   "apply -f FILE|DIR|-",
		Short: "Create and update what manifests declare",
		Long: "Apply makes the fleet hold what the manifests declare (apiVersion " + manifest.APIVersion + "; kinds " + kindList() + "). " +
			"It reads every manifest first and changes nothing when one is invalid, names a project that is neither declared nor in the fleet, or asks for a change the API cannot make. " +
			"Objects are applied in dependency order (clusters, role templates, cluster sets and subscribers, then import policies and projects, then cluster set bindings, placements and the namespace and role bindings, then service weights), each reported as created, configured or unchanged; " +
			"a second apply of the same manifests reports every object unchanged. " +
			"Updates are conditional on the revision apply read, so a change made by someone else meanwhile fails the object (aborted) instead of being overwritten; apply again to decide on fresh state. " +
			"An object that fails leaves the others applied; a rerun finishes the rest. " +
			"With --applyset, the set owns the fields it applied (kept in a record per set, see --applyset-records): a field someone else changed since (another apply set, an API call, a fleetctl command) is a conflict, reported per object and field, and nothing is written unless --force-conflicts takes the fields over. " +
			"A newly registered cluster's agent token is written to --token-dir/<cluster>.token (mode 0600) and never printed. " +
			"--dry-run=server sends each object apply would create, configure or prune to its service with dry_run: the service validates, authorizes and decides as for the write, refuses with the write's own error, and writes nothing. " +
			"Under each object it prints what the service answers: Cluster, the labels, claims and taints it would have; RoleTemplate, its effective rules and the ClusterRoles that would change on which cluster; ClusterSet, the clusters it would hold; Subscriber, its consumers; ImportPolicy, that its source is free; " +
			"Project, each budget it would set and what the project's namespaces hold of it; Placement, the clusters the scheduler would decide now; ClusterSetBinding, whether the set exists; " +
			"NamespaceBinding, the cluster(s) and quota, and the project's budget there as it would be allocated; ProjectRoleBinding, the RoleBindings that would change on which cluster; ServiceWeights, each weight change; a pruned object, what its deletion would release. " +
			"Each object is asked about against the fleet as it is, not as the objects before it in the same apply would leave it; one that needs an object the apply creates first is listed without asking.",
		Example: applyExample,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if concurrency < 1 {
				return fmt.Errorf("--concurrency %d: must be at least 1", concurrency)
			}
			switch dryRun {
			case dryRunNone, dryRunClient, dryRunServer:
			default:
				return fmt.Errorf("--dry-run %q: want client or server", dryRun)
			}
			if prune && applySet == "" {
				return errors.New("--prune needs --applyset: the set whose objects the manifests no longer declare are deleted")
			}
			if cascade && !prune {
				return errors.New("--cascade applies only with --prune")
			}
			if (forceConflicts || recordDir != "") && applySet == "" {
				return errors.New("--force-conflicts and --applyset-records apply only with --applyset: fields are owned by apply sets")
			}
			if applySet != "" && !dnsLabelRE.MatchString(applySet) {
				return fmt.Errorf("--applyset %q: want a DNS label", applySet)
			}
			objs, err := mf.read(f)
			if err != nil {
				return err
			}
			if prune && len(objs) == 0 {
				// An empty read is far more often a wrong path than a wish to empty the set.
				return fmt.Errorf("--prune with no manifests would delete every object of apply set %s; refusing", applySet)
			}
			ctx := cmd.Context()
			own, store, err := ownershipFor(f, applySet, recordDir)
			if err != nil {
				return err
			}
			planned, state, err := plan(ctx, f, objs, tokenDir, applySet, prune, own)
			if err != nil {
				return err
			}
			var pruned []*liveObject
			var refusals []error
			if prune {
				pruned, refusals = prunable(objs, state, applySet, cascade)
			}
			for _, p := range planned {
				if p.err != nil {
					refusals = append(refusals, fmt.Errorf("%s: %s: %w", p.obj.Source, p.obj.Key(), p.err))
				}
			}
			conflicted := reportConflicts(f, planned, forceConflicts)
			lost := checkUnrecorded(f, own, store, state, planned, forceConflicts)
			if len(refusals) > 0 {
				for _, err := range refusals {
					fmt.Fprintln(f.streams.ErrOut, err)
				}
				if conflicted > 0 {
					return fmt.Errorf("%d of %d objects cannot be applied, and %d conflict with changes others made (--force-conflicts takes those over); nothing was changed", len(refusals), len(planned)+len(pruned), conflicted)
				}
				return fmt.Errorf("%d of %d objects cannot be applied; nothing was changed", len(refusals), len(planned)+len(pruned))
			}
			if conflicted > 0 {
				return conflictError(conflicted, len(planned)+len(pruned), applySet)
			}
			if lost != nil {
				return lost
			}
			if dryRun == dryRunServer {
				return serverDryRun(ctx, f, planned, pruned, state, cascade)
			}
			if dryRun == dryRunClient {
				for _, p := range planned {
					fmt.Fprintf(f.streams.Out, "%s %s (dry run)\n", p.obj.Key(), p.outcome)
				}
				for _, l := range pruned {
					fmt.Fprintf(f.streams.Out, "%s %s (dry run)\n", l.obj.Key(), outcomePruned)
				}
				return nil
			}
			failed := applyPlanned(ctx, f, planned, tokenDir, concurrency)
			if failed == 0 {
				// Only once everything declared is in place: a failed apply must not leave
				// the fleet with less than it had.
				failed += prunePlanned(ctx, f, pruned, cascade, concurrency)
			}
			var errs []error
			if own != nil {
				// Also after a partial failure: what did apply is the set's from now on.
				rec, err := own.recordApplied(planned)
				if err == nil {
					err = store.save(rec)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("the record of what apply set %s applied could not be written, so its next apply cannot tell its own fields from others' (%s): %w", applySet, store.path(applySet), err))
				}
			}
			if failed > 0 {
				errs = append(errs, fmt.Errorf("%d of %d objects failed; apply again to finish", failed, len(planned)+len(pruned)))
			}
			return errors.Join(errs...)
		},
	}
	mf.add(cmd)
	cmd.Flags().StringVar(&tokenDir, "token-dir", "", "directory the agent tokens of newly registered clusters are written to, as <cluster>.token (required when a Cluster is created)")
	cmd.Flags().StringVar(&dryRun, "dry-run", dryRunNone, "print what would be done without changing anything: client (the plan apply makes from what it read; the default of a bare --dry-run) or server (also send each object's write to its service with dry_run, which refuses or answers as the write would; see above for what each kind answers; exit 1 when a service refuses one)")
	cmd.Flags().Lookup("dry-run").NoOptDefVal = dryRunClient
	cmd.Flags().IntVar(&concurrency, "concurrency", 16, "objects of one dependency level applied at once")
	cmd.Flags().StringVar(&applySet, "applyset", "", "name of the apply set: the declared clusters and projects are labelled "+partOfLabel+"=NAME, and with --prune the set's objects the manifests no longer declare are deleted")
	cmd.Flags().BoolVar(&prune, "prune", false, "delete the objects of --applyset that the manifests no longer declare (the set's clusters and projects, and what belongs to its projects or to the declared ones; role templates, cluster sets, subscribers, import policies and service weights have no labels to record the set and are never pruned); list them first with --dry-run")
	cmd.Flags().BoolVar(&cascade, "cascade", false, "with --prune: delete a project that still holds namespaces, unbinding them (otherwise refused)")
	addOwnershipFlags(cmd, &forceConflicts, &recordDir)
	return cmd
}

func addOwnershipFlags(cmd *cobra.Command, force *bool, dir *string) {
	cmd.Flags().BoolVar(force, "force-conflicts", false, "with --applyset: apply fields that someone else changed since the set last applied them, taking them over")
	cmd.Flags().StringVar(dir, "applyset-records", "", "directory of the apply sets' records of what they last applied, <set>.json (default: applysets/<server>/ beside the configuration file); one per server (a record of another server is refused); a CI job keeps it between runs")
}

// ownershipFor loads what applySet owns; nil without an apply set (apply then owns every field
// it declares, as before apply sets).
func ownershipFor(f *factory, applySet, dir string) (*ownership, *recordStore, error) {
	if applySet == "" {
		return nil, nil, nil
	}
	store, err := newRecordStore(f, dir)
	if err != nil {
		return nil, nil, err
	}
	own, err := loadOwnership(store, applySet)
	if err != nil {
		return nil, nil, err
	}
	return own, store, nil
}

// reportConflicts prints each conflicting field to stderr, one line per object and field, and
// returns how many objects conflict; with force they are taken over, which is said too.
func reportConflicts(f *factory, planned []*plannedObject, force bool) int {
	n := 0
	for _, p := range planned {
		for _, c := range p.conflicts {
			if force {
				fmt.Fprintf(f.streams.ErrOut, "%s: %s: %s (taken over: --force-conflicts)\n", p.obj.Source, p.obj.Key(), c)
			} else {
				fmt.Fprintf(f.streams.ErrOut, "%s: %s: %s\n", p.obj.Source, p.obj.Key(), c)
			}
		}
		if len(p.conflicts) > 0 {
			n++
		}
	}
	if force {
		return 0
	}
	return n
}

// checkUnrecorded handles an apply set without a record here. When objects in the fleet carry
// the set's label it has applied before and its record was lost (a CI cache evicted, another
// runner): apply cannot tell the set's fields from changes made by hand since, so it refuses
// unless force takes every declared field over. Otherwise this is the set's first apply: the
// existing objects of planned it configures were checked only against the sets recorded beside
// it, which it says (diff passes none: it configures nothing).
func checkUnrecorded(f *factory, own *ownership, store *recordStore, state *fleetState, planned []*plannedObject, force bool) error {
	if own == nil || own.mine != nil {
		return nil
	}
	var labelled []string
	for _, k := range state.keys {
		if state.byKey[k].obj.Labels[partOfLabel] == own.set {
			labelled = append(labelled, k)
		}
	}
	if len(labelled) > 0 {
		shown := labelled
		if len(shown) > 3 {
			shown = append(slices.Clip(shown[:3]), "…")
		}
		what := fmt.Sprintf("apply set %s has no record of what it applied (%s), yet %d object(s) in the fleet carry its label %s=%s (%s): its record was lost, so changes made since by others cannot be told from its own",
			own.set, store.path(own.set), len(labelled), partOfLabel, own.set, strings.Join(shown, ", "))
		if force {
			fmt.Fprintf(f.streams.ErrOut, "%s (every declared field taken over: --force-conflicts)\n", what)
			return nil
		}
		return fmt.Errorf("%s; nothing was changed. Restore the record, or take every declared field over with --force-conflicts", what)
	}
	n := 0
	for _, p := range planned {
		if p.err == nil && p.outcome == outcomeConfigured {
			n++
		}
	}
	if n > 0 {
		fmt.Fprintf(f.streams.ErrOut, "apply set %s has no record of what it applied (%s): %d existing object(s) are configured without telling its fields from changes others made, except the fields of apply sets recorded there\n", own.set, store.path(own.set), n)
	}
	return nil
}

func conflictError(conflicted, total int, applySet string) error {
	return fmt.Errorf("%d of %d objects conflict with changes others made since apply set %s last applied them; nothing was changed. "+
		"Take the manifests' values with --force-conflicts, or put the live values into the manifests", conflicted, total, applySet)
}

const (
	dryRunNone   = "none"
	dryRunClient = "client"
	dryRunServer = "server"
)

// prunePlanned deletes the pruned objects level by level (bindings first), printing each,
// and returns how many failed.
func prunePlanned(ctx context.Context, f *factory, pruned []*liveObject, cascade bool, concurrency int) int {
	failed := 0
	for start := 0; start < len(pruned); {
		end := start
		for end < len(pruned) && pruned[end].obj.Kind.Rank == pruned[start].obj.Kind.Rank {
			end++
		}
		level := pruned[start:end]
		errs := make([]error, len(level))
		sem := make(chan struct{}, concurrency)
		var wg sync.WaitGroup
		for i, l := range level {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				errs[i] = deleteObject(ctx, f, l.obj, l, cascade)
			}()
		}
		wg.Wait()
		for i, l := range level {
			if errs[i] != nil {
				failed++
				var b bytes.Buffer
				PrintError(&b, errs[i])
				fmt.Fprintf(f.streams.ErrOut, "%s: %s", l.obj.Key(), b.String())
				continue
			}
			fmt.Fprintf(f.streams.Out, "%s %s\n", l.obj.Key(), outcomePruned)
		}
		start = end
	}
	return failed
}

// dnsLabelRE is an RFC 1123 label.
var dnsLabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// applyPlanned applies the planned objects level by level (a level's objects at most
// concurrency at a time, the next level once it is done), printing each outcome in declared
// order, and returns how many failed. From 1,000 objects on, a progress line goes to stderr
// every few seconds and after each level.
func applyPlanned(ctx context.Context, f *factory, planned []*plannedObject, tokenDir string, concurrency int) int {
	var done atomic.Int64
	// The progress line is written from its own goroutine: every write to ErrOut here goes
	// through one lock, and the goroutine is gone before applyPlanned returns.
	errOut := &lockedWriter{w: f.streams.ErrOut}
	if len(planned) >= 1000 {
		stop, stopped := make(chan struct{}), make(chan struct{})
		defer func() { close(stop); <-stopped }()
		go func() {
			defer close(stopped)
			t := time.NewTicker(2 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					fmt.Fprintf(errOut, "applied %d of %d objects\n", done.Load(), len(planned))
				}
			}
		}()
	}
	failed := 0
	for start := 0; start < len(planned); {
		end := start
		for end < len(planned) && planned[end].level == planned[start].level {
			end++
		}
		level := planned[start:end]
		sem := make(chan struct{}, concurrency)
		var wg sync.WaitGroup
		for _, p := range level {
			if p.outcome == outcomeUnchanged {
				done.Add(1)
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				p.err = applyObject(ctx, f, p.obj, p.live, tokenDir)
				done.Add(1)
			}()
		}
		wg.Wait()
		if len(planned) >= 1000 {
			fmt.Fprintf(errOut, "applied %d of %d objects\n", done.Load(), len(planned))
		}
		for _, p := range level {
			if p.err != nil {
				failed++
				var b bytes.Buffer
				PrintError(&b, p.err)
				fmt.Fprintf(errOut, "%s: %s", p.obj.Key(), b.String())
				continue
			}
			fmt.Fprintf(f.streams.Out, "%s %s\n", p.obj.Key(), p.outcome)
		}
		start = end
	}
	return failed
}

func kindList() string {
	var names []string
	for _, k := range manifest.Kinds() {
		names = append(names, k.Name)
	}
	return strings.Join(names, ", ")
}

func newDiffCommand(f *factory) *cobra.Command {
	var (
		mf             manifestFlags
		applySet       string
		prune          bool
		forceConflicts bool
		recordDir      string
	)
	cmd := &cobra.Command{
		Use:   "diff -f FILE|DIR|-",
		Short: "Show what apply would change, as a unified diff",
		Long: "Diff prints, for every declared object that apply would create or change, a unified diff from the object as the fleet holds it (live/) to the manifest (declared/), both in manifest form; " +
			"with --applyset and --prune, also the objects apply --prune would delete (to /dev/null). " +
			"It exits 0 when apply would change nothing, 1 when it would change something and 2 on an error, as kubectl diff does, so CI can gate on it; a change apply would refuse (one the API cannot make) is an error, listed on stderr (the diff is still printed); " +
			"with --applyset, fields that apply would take from another writer are conflicts, listed on stderr with exit 2 unless --force-conflicts.",
		Example: "  fleetctl diff -f fleet/ && echo 'in sync'\n  fleetctl diff -f fleet/ --applyset prod --prune",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (retErr error) {
			if prune && applySet == "" {
				return &exitError{code: 2, err: errors.New("--prune needs --applyset")}
			}
			if (forceConflicts || recordDir != "") && applySet == "" {
				return &exitError{code: 2, err: errors.New("--force-conflicts and --applyset-records apply only with --applyset: fields are owned by apply sets")}
			}
			if applySet != "" && !dnsLabelRE.MatchString(applySet) {
				// It names the set's record file too.
				return &exitError{code: 2, err: fmt.Errorf("--applyset %q: want a DNS label", applySet)}
			}
			objs, err := mf.read(f)
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			own, store, err := ownershipFor(f, applySet, recordDir)
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			planned, state, err := plan(cmd.Context(), f, objs, "", applySet, prune, own)
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			// What apply would refuse is an error here too (2), before any diff.
			if err := checkUnrecorded(f, own, store, state, nil, forceConflicts); err != nil {
				return &exitError{code: 2, err: err}
			}
			// A change apply would refuse (one the API cannot make, a project neither declared
			// nor in the fleet) is an error (2), the diff still printed, as kubectl diff fails on
			// a change the server rejects: exit 1 would pass a pull request whose merge fails.
			var refused int
			for _, p := range planned {
				var noTokenDir noTokenDirError
				if p.err != nil && !errors.As(p.err, &noTokenDir) {
					fmt.Fprintf(f.streams.ErrOut, "%s: %s: %v\n", p.obj.Source, p.obj.Key(), p.err)
					refused++
				}
			}
			if refused > 0 {
				defer func() {
					var ee *exitError
					if retErr == nil || errors.As(retErr, &ee) && ee.code == 1 {
						retErr = &exitError{code: 2, err: fmt.Errorf("%d of %d objects cannot be applied as declared (above); apply would change nothing", refused, len(planned))}
					}
				}()
			}
			// Conflicts are what apply would refuse: an error (2), as kubectl diff --server-side
			// says of a conflict, after the diff itself so the reader sees both.
			defer func() {
				var ee *exitError
				if retErr != nil && (!errors.As(retErr, &ee) || ee.code != 1) {
					return // an error already: exit 2 with it
				}
				if conflicted := reportConflicts(f, planned, forceConflicts); conflicted > 0 {
					retErr = &exitError{code: 2, err: conflictError(conflicted, len(planned), applySet)}
				}
			}()
			changed := false
			for _, p := range planned {
				d, err := diffObject(p.obj, p.live)
				if err != nil {
					return &exitError{code: 2, err: err}
				}
				if d != "" {
					changed = true
					io.WriteString(f.streams.Out, d)
				}
			}
			if prune {
				// A project that prune would refuse is still shown: diff says what the
				// manifests ask for; apply says what it will not do.
				pruned, _ := prunable(objs, state, applySet, true)
				for _, l := range pruned {
					have, err := manifest.Marshal(redacted(l.obj))
					if err != nil {
						return &exitError{code: 2, err: err}
					}
					d, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: lines(have), FromFile: "live/" + l.obj.Key(), ToFile: "/dev/null", Context: 3})
					if err != nil {
						return &exitError{code: 2, err: err}
					}
					changed = true
					io.WriteString(f.streams.Out, d)
				}
			}
			if changed {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	mf.add(cmd)
	cmd.Flags().StringVar(&applySet, "applyset", "", "the apply set, as given to apply")
	cmd.Flags().BoolVar(&prune, "prune", false, "also show the objects of --applyset that apply --prune would delete")
	addOwnershipFlags(cmd, &forceConflicts, &recordDir)
	return cmd
}

// diffObject is the unified diff from live (nil: absent) to declared, empty when apply would
// leave the object unchanged.
func diffObject(declared *manifest.Object, live *liveObject) (string, error) {
	if live != nil && sameObject(declared, live.obj) {
		return "", nil
	}
	declared = redacted(declared)
	if live != nil {
		live = &liveObject{obj: redacted(live.obj), revision: live.revision}
	}
	want, err := manifest.Marshal(declared)
	if err != nil {
		return "", err
	}
	var have []byte
	from := "live/" + declared.Key()
	if live != nil {
		// What the API does not keep (annotations, the name of a binding) is not a
		// difference: take it from the manifest.
		l := *live.obj
		l.Annotations = declared.Annotations
		if l.Name == "" {
			l.Name = declared.Name
		}
		if have, err = manifest.Marshal(&l); err != nil {
			return "", err
		}
	} else {
		from = "/dev/null"
	}
	return difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A: lines(have), B: lines(want),
		FromFile: from, ToFile: "declared/" + declared.Key(), Context: 3,
	})
}

// redacted is o as diff may print it: an import policy's template may hold a credential written
// through the API, and diff's output goes to CI logs (conflict messages hide it too, see
// hiddenField). Each side shows a short sha256 of its template instead, so that a change is
// still seen.
func redacted(o *manifest.Object) *manifest.Object {
	p, ok := o.Spec.(*clusterv1.ImportPolicy)
	if !ok || p.GetTemplate() == "" {
		return o
	}
	sum := sha256.Sum256([]byte(p.GetTemplate()))
	spec := proto.Clone(p).(*clusterv1.ImportPolicy)
	spec.Template = "(not shown: it may hold credentials; sha256 " + hex.EncodeToString(sum[:])[:12] + ")"
	c := *o
	c.Spec = spec
	return &c
}

// lines splits a document into lines that keep their newline; none for an empty document
// (difflib's SplitLines would make it one empty line, a context line in every creation).
func lines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	l := strings.SplitAfter(string(b), "\n")
	if l[len(l)-1] == "" {
		l = l[:len(l)-1]
	}
	return l
}

func newExportCommand(f *factory) *cobra.Command {
	var (
		project string
		kinds   []string
	)
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Print the fleet as manifests that apply cleanly",
		Long: "Export prints what the fleet holds as " + manifest.APIVersion + " manifests, in apply order: the whole fleet, one project (--project: the project and what belongs to it) or some kinds (--kind). " +
			"Applying the output to an empty fleet rebuilds it: every List answers the same, ids, revisions and times aside. " +
			"Built-in role templates and cluster sets, the claims agents report and the taints the registry manages are left out, since no manifest declares them.",
		Example: "  fleetctl export > fleet.yaml\n  fleetctl export --project team-a\n  fleetctl export --kind Cluster,RoleTemplate",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var want map[string]bool
			if len(kinds) > 0 {
				want = map[string]bool{}
				for _, k := range kinds {
					if manifest.KindNamed(k) == nil {
						return fmt.Errorf("--kind %q: want one of %s", k, kindList())
					}
					want[k] = true
				}
			}
			state, err := readFleet(cmd.Context(), f, want, project)
			if err != nil {
				return err
			}
			return manifest.Encode(f.streams.Out, state.objects())
		},
	}
	cmd.Flags().StringVar(&project, "project", "", "export only this project and what belongs to it")
	cmd.Flags().StringSliceVar(&kinds, "kind", nil, "export only these kinds (comma-separated or repeated)")
	return cmd
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
