package placement

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"
	"k8s.io/apimachinery/pkg/api/resource"
)

// CEL selectors (OCM's celSelector.celExpressions): expressions over the
// variable managedCluster, shaped as OCM's unstructured ManagedCluster, with
// OCM's scores() member function and the Kubernetes semver helpers OCM's
// environment carries. A predicate's expressions are ANDed with each other
// and with its label and claim selectors. An expression that fails at run
// time (a missing key, the runtime cost limit) is false for that cluster, as
// in OCM.

const (
	// CELCostLimit bounds both an expression's estimated worst-case cost when
	// it is written and its actual cost on each evaluation (Kubernetes'
	// per-call limit for CEL in admission). Comparing a few labels costs
	// under 20; a loop over the labels costs about 10 per label.
	CELCostLimit = 1_000_000
	// CELMaxSize is the size the cost estimation assumes for every map,
	// list and string it cannot size itself (labels, claims, taints, a
	// score list, a label's value): at most this many entries or characters.
	// One bound for all, because what is reached through managedCluster is
	// typed dyn and the estimation cannot tell a string from a list there.
	// A fleet with more is still evaluated; the runtime limit then applies.
	CELMaxSize = 256
	// celMaxExpressionLength refuses an expression before parsing it.
	celMaxExpressionLength = 4096
	// celCacheSize bounds the program memo; past it, it starts over.
	celCacheSize = 4096
)

// celEnv is the environment every expression compiles in; it holds
// declarations only, so one value serves every fleet and caller.
var celEnv = sync.OnceValues(func() (*cel.Env, error) { return newCELEnv(ext.Strings()) })

// celEnvEstimated is celEnv without cel-go's strings extension, whose
// functions (split, replace, ...) the cost estimation knows no sizes for:
// an expression that compiles here has an estimate that bounds its cost.
var celEnvEstimated = sync.OnceValues(func() (*cel.Env, error) { return newCELEnv() })

func newCELEnv(extra ...cel.EnvOption) (*cel.Env, error) {
	return cel.NewEnv(append([]cel.EnvOption{
		cel.Variable("managedCluster", cel.MapType(cel.StringType, cel.DynType)),
		cel.Function("scores",
			cel.MemberOverload("cluster_scores", []*cel.Type{cel.DynType, cel.StringType}, cel.ListType(cel.DynType),
				cel.BinaryBinding(clusterScores))),
		cel.OptionalTypes(),
		semverLib(),
	}, extra...)...)
}

// celProgram is one compiled, cost-checked expression.
type celProgram struct {
	expr string
	// limited tracks the cost of each evaluation and stops it at
	// CELCostLimit. bounded, when not nil, does not track: its compile-time
	// estimate already bounds every evaluation on a fleet whose clusters are
	// within the estimate's size assumptions (celInputs.bounded), and
	// tracking costs about 40% of an evaluation. It is nil for expressions
	// using functions the estimate knows no sizes for.
	limited, bounded cel.Program
}

// celPrograms memoises compileCEL. Compiling is a pure function of the
// expression, so the memo can never change a decision; it is what keeps a
// re-decision from re-parsing and re-checking the same expressions every
// round. It lives beside the environment rather than in Fleet because a
// fleet is rebuilt on every cluster change.
var celPrograms = struct {
	sync.Mutex
	m map[string]*celProgram
}{m: map[string]*celProgram{}}

// CheckCELExpression compiles expr in the CEL selector environment and
// estimates its worst-case cost: a syntax or type error, a result that is
// not a bool, or an estimate over CELCostLimit is an error. The API refuses
// such an expression when a placement is written.
func CheckCELExpression(expr string) error {
	_, err := compileCEL(expr)
	return err
}

func compileCEL(expr string) (*celProgram, error) {
	celPrograms.Lock()
	p, ok := celPrograms.m[expr]
	celPrograms.Unlock()
	if ok {
		return p, nil
	}
	if len(expr) > celMaxExpressionLength {
		return nil, fmt.Errorf("longer than %d bytes", celMaxExpressionLength)
	}
	env, err := celEnv()
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		return nil, fmt.Errorf("compilation failed: %w", iss.Err())
	}
	if !ast.OutputType().IsExactType(cel.BoolType) && !ast.OutputType().IsExactType(cel.DynType) {
		return nil, fmt.Errorf("must evaluate to a bool, not %s", ast.OutputType())
	}
	est, err := env.EstimateCost(ast, sizeEstimator{})
	if err != nil {
		return nil, fmt.Errorf("cost estimation failed: %w", err)
	}
	if est.Max > CELCostLimit {
		return nil, fmt.Errorf("estimated cost %d exceeds the limit %d (every map, list and string assumed to hold up to %d entries or characters)",
			est.Max, CELCostLimit, CELMaxSize)
	}
	// OptOptimize folds calls on constants (semver("1.30.0"), a literal
	// list for "in") once here instead of once per cluster.
	limited, err := env.Program(ast, cel.CostLimit(CELCostLimit), cel.CostTracking(runtimeCost{}), cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, fmt.Errorf("instantiation failed: %w", err)
	}
	p = &celProgram{expr: expr, limited: limited}
	if est, err := celEnvEstimated(); err == nil {
		if ast, iss := est.Compile(expr); iss.Err() == nil {
			if p.bounded, err = est.Program(ast, cel.EvalOptions(cel.OptOptimize)); err != nil {
				return nil, fmt.Errorf("instantiation failed: %w", err)
			}
		}
	}
	celPrograms.Lock()
	if len(celPrograms.m) >= celCacheSize {
		celPrograms.m = map[string]*celProgram{}
	}
	celPrograms.m[expr] = p
	celPrograms.Unlock()
	return p, nil
}

// compileCELSelector compiles a predicate's expressions, or names the first
// bad one; field names the predicate's selector, called only then.
func compileCELSelector(exprs []string, field func() string) ([]*celProgram, *misconfig) {
	var out []*celProgram
	for i, e := range exprs {
		p, err := compileCEL(e)
		if err != nil {
			return nil, &misconfig{field: fmt.Sprintf("%s.cel_selector.cel_expressions[%d]", field(), i), msg: err.Error()}
		}
		out = append(out, p)
	}
	return out, nil
}

// celMatches evaluates every expression (ANDed) against cluster i; an error,
// including the runtime cost limit, makes it false.
func celMatches(progs []*celProgram, f *Fleet, i int) bool {
	in, bounded := f.celInput(i)
	for _, p := range progs {
		prg := p.limited
		if bounded && p.bounded != nil {
			prg = p.bounded
		}
		out, _, err := prg.Eval(in)
		if err != nil {
			return false
		}
		if b, ok := out.(types.Bool); !ok || !bool(b) {
			return false
		}
	}
	return true
}

// sizeEstimator bounds every size the cost estimation cannot know.
type sizeEstimator struct{}

func (sizeEstimator) EstimateSize(n checker.AstNode) *checker.SizeEstimate {
	if s := n.ComputedSize(); s != nil {
		return s
	}
	return &checker.SizeEstimate{Min: 0, Max: CELMaxSize}
}

func (sizeEstimator) EstimateCallCost(function, _ string, _ *checker.AstNode, _ []checker.AstNode) *checker.CallEstimate {
	switch function {
	case "scores":
		// A lookup, then one small map per score.
		return &checker.CallEstimate{CostEstimate: checker.CostEstimate{Min: 1, Max: 1 + CELMaxSize},
			ResultSize: &checker.SizeEstimate{Min: 0, Max: CELMaxSize}}
	case "semver", "isSemver":
		return &checker.CallEstimate{CostEstimate: checker.CostEstimate{Min: 1, Max: 1 + CELMaxSize/10}}
	}
	return nil
}

// runtimeCost charges scores() by the number of scores it returns; every
// other call keeps cel-go's default cost.
type runtimeCost struct{}

func (runtimeCost) CallCost(function, _ string, _ []ref.Val, result ref.Val) *uint64 {
	if function != "scores" {
		return nil
	}
	c := uint64(1)
	if l, ok := result.(traits.Lister); ok {
		if n, ok := l.Size().(types.Int); ok {
			c += uint64(n) //nolint:gosec // a size is not negative
		}
	}
	return &c
}

// clusterValue is managedCluster: OCM's unstructured ManagedCluster as a CEL
// map, carrying the fleet's add-on scores for scores().
type clusterValue struct {
	traits.Mapper
	scores map[string][]AddOnScore // by resource name, sorted by score name
}

var errNotACluster = errors.New("scores() is only defined on managedCluster")

// clusterScores is OCM's scores(): the named add-on score resource's scores
// as [{name, value}], an error if the cluster has none of that resource.
// valid_until is not looked at, as OCM's does not look at validUntil.
func clusterScores(cluster, resource ref.Val) ref.Val {
	c, ok := cluster.(*clusterValue)
	if !ok {
		return types.WrapErr(errNotACluster)
	}
	name, ok := resource.(types.String)
	if !ok {
		return types.MaybeNoSuchOverloadErr(resource)
	}
	ss, ok := c.scores[string(name)]
	if !ok {
		return types.NewErr("failed to get score: no add-on score resource %q", string(name))
	}
	out := make([]ref.Val, len(ss))
	for i, s := range ss {
		out[i] = types.NewStringInterfaceMap(types.DefaultTypeAdapter, map[string]any{"name": s.ScoreName, "value": int64(s.Score)})
	}
	return types.NewRefValList(types.DefaultTypeAdapter, out)
}

// celInputs holds what CEL reads of each cluster. The fleet-wide part (the
// add-on scores by cluster, and whether the fleet is within the estimate's
// sizes) is built on the first CEL evaluation against this fleet, and each
// cluster's value on its first evaluation: a fleet whose placements use no
// CEL never pays for it, and clusters a label or claim selector already
// refused are never built.
type celInputs struct {
	once      sync.Once
	byCluster map[string]map[string][]AddOnScore
	// bounded: every map, list and string CEL can reach in this fleet is
	// within CELMaxSize.
	bounded bool
	acts    []lazyActivation
}

type lazyActivation struct {
	once sync.Once
	act  clusterActivation
}

func (f *Fleet) celInput(i int) (interpreter.Activation, bool) {
	f.cel.once.Do(func() {
		byCluster := map[string]map[string][]AddOnScore{}
		for k, s := range f.scores {
			m := byCluster[k.Cluster]
			if m == nil {
				m = map[string][]AddOnScore{}
				byCluster[k.Cluster] = m
			}
			m[k.ResourceName] = append(m[k.ResourceName], s)
		}
		bounded := true
		for _, m := range byCluster {
			for _, ss := range m {
				sort.Slice(ss, func(a, b int) bool { return ss[a].ScoreName < ss[b].ScoreName })
				bounded = bounded && len(ss) <= CELMaxSize
				for _, sc := range ss {
					bounded = bounded && len(sc.ScoreName) <= CELMaxSize
				}
			}
		}
		for j := range f.clusters {
			bounded = bounded && withinCELEstimate(&f.clusters[j].Cluster)
		}
		f.cel.byCluster, f.cel.bounded = byCluster, bounded
		f.cel.acts = make([]lazyActivation, len(f.clusters))
	})
	a := &f.cel.acts[i]
	a.once.Do(func() {
		c := &f.clusters[i].Cluster
		a.act = clusterActivation{&clusterValue{Mapper: managedClusterObject(c), scores: f.cel.byCluster[c.Name]}}
	})
	return a.act, f.cel.bounded
}

// clusterActivation binds managedCluster, the one variable, without a map.
type clusterActivation struct{ cluster *clusterValue }

func (a clusterActivation) ResolveName(name string) (any, bool) {
	if name == "managedCluster" {
		return a.cluster, true
	}
	return nil, false
}

func (clusterActivation) Parent() interpreter.Activation { return nil }

// withinCELEstimate says whether every map, list and string of c that CEL
// can reach is within the sizes the cost estimation assumed.
func withinCELEstimate(c *Cluster) bool {
	if len(c.Labels) > CELMaxSize || len(c.Claims) > CELMaxSize || len(c.Taints) > CELMaxSize || len(c.Name) > CELMaxSize {
		return false
	}
	for k, v := range c.Labels {
		if len(k) > CELMaxSize || len(v) > CELMaxSize {
			return false
		}
	}
	for k, v := range c.Claims {
		if len(k) > CELMaxSize || len(v) > CELMaxSize {
			return false
		}
	}
	for _, t := range c.Taints {
		if len(t.Key) > CELMaxSize || len(t.Value) > CELMaxSize || len(t.Effect) > CELMaxSize {
			return false
		}
	}
	return true
}

// managedClusterObject renders a cluster as the fields of OCM's
// ManagedCluster that Fleetstream has: metadata (name, labels), spec.taints,
// status.clusterClaims, status.version.kubernetes (from the
// kubeversion.fleetstream.io claim) and status.allocatable/capacity. It
// builds CEL values directly, once per fleet, so an evaluation reads them
// without converting Go maps on every field access.
func managedClusterObject(c *Cluster) traits.Mapper {
	labels := c.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	names := make([]string, 0, len(c.Claims))
	for k := range c.Claims {
		names = append(names, k)
	}
	sort.Strings(names)
	claims := make([]ref.Val, len(names))
	for i, n := range names {
		claims[i] = celMap("name", types.String(n), "value", types.String(c.Claims[n]))
	}
	taints := make([]ref.Val, len(c.Taints))
	for i, t := range c.Taints {
		kv := []any{"key", types.String(t.Key), "value", types.String(t.Value), "effect", types.String(t.Effect)}
		if !t.TimeAdded.IsZero() {
			kv = append(kv, "timeAdded", types.String(t.TimeAdded.UTC().Format(time.RFC3339)))
		}
		taints[i] = celMap(kv...)
	}
	status := []any{
		"clusterClaims", types.NewRefValList(types.DefaultTypeAdapter, claims),
		"allocatable", quantities(c.Allocatable),
		"capacity", quantities(c.Capacity),
	}
	if v, ok := c.Claims[ClaimKubeVersion]; ok {
		status = append(status, "version", celMap("kubernetes", types.String(v)))
	}
	return celMap(
		"metadata", celMap("name", types.String(c.Name), "labels", types.NewStringStringMap(types.DefaultTypeAdapter, labels)),
		"spec", celMap("taints", types.NewRefValList(types.DefaultTypeAdapter, taints)),
		"status", celMap(status...),
	)
}

// celMap builds a CEL map from string keys and CEL values, alternating.
func celMap(kv ...any) traits.Mapper {
	o := make(celObject, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		o = append(o, celField{key: kv[i].(string), val: kv[i+1].(ref.Val)})
	}
	return o
}

// celObject is a small CEL map with string keys (the fixed fields of
// managedCluster), kept as one slice searched in order. cel-go's generic map
// hashes interface keys and its Go-map adapter converts a nested map on
// every access; a Go map per object costs a cache miss per field over 5,000
// clusters. What evaluations rarely do (iterate, compare, convert) goes
// through a generic map built for the occasion.
type celObject []celField

type celField struct {
	key string
	val ref.Val
}

func (o celObject) lookup(k string) (ref.Val, bool) {
	for i := range o {
		if o[i].key == k {
			return o[i].val, true
		}
	}
	return nil, false
}

func (o celObject) generic() traits.Mapper {
	m := make(map[ref.Val]ref.Val, len(o))
	for _, f := range o {
		m[types.String(f.key)] = f.val
	}
	return types.NewRefValMap(types.DefaultTypeAdapter, m)
}

func (o celObject) Find(k ref.Val) (ref.Val, bool) {
	if s, ok := k.(types.String); ok {
		return o.lookup(string(s))
	}
	return o.generic().Find(k)
}

func (o celObject) Get(k ref.Val) ref.Val {
	if v, found := o.Find(k); found {
		return v
	}
	return o.generic().Get(k)
}

func (o celObject) Contains(k ref.Val) ref.Val {
	if s, ok := k.(types.String); ok {
		_, found := o.lookup(string(s))
		return types.Bool(found)
	}
	return o.generic().Contains(k)
}

func (o celObject) ConvertToNative(t reflect.Type) (any, error) {
	return o.generic().ConvertToNative(t)
}
func (o celObject) ConvertToType(t ref.Type) ref.Val { return o.generic().ConvertToType(t) }
func (o celObject) Equal(other ref.Val) ref.Val      { return o.generic().Equal(other) }
func (o celObject) Iterator() traits.Iterator        { return o.generic().Iterator() }
func (o celObject) Size() ref.Val                    { return types.Int(len(o)) }
func (o celObject) Type() ref.Type                   { return types.MapType }
func (o celObject) Value() any                       { return o.generic().Value() }

// ClaimKubeVersion is the claim cluster-import reports a cluster's
// Kubernetes version in; CEL sees it as managedCluster.status.version.kubernetes.
const ClaimKubeVersion = "kubeversion.fleetstream.io"

func quantities(q map[ResourceName]resource.Quantity) traits.Mapper { return quantityMap(q) }

// quantityMap shows allocatable or capacity as quantity strings, formatted
// when read: formatting every cluster's up front was a fifth of preparing a
// fleet's CEL values.
type quantityMap map[ResourceName]resource.Quantity

func (q quantityMap) generic() traits.Mapper {
	out := make(map[string]string, len(q))
	for k, v := range q {
		out[string(k)] = v.String()
	}
	return types.NewStringStringMap(types.DefaultTypeAdapter, out)
}

func (q quantityMap) Find(k ref.Val) (ref.Val, bool) {
	if s, ok := k.(types.String); ok {
		v, found := q[ResourceName(s)]
		if !found {
			return nil, false
		}
		return types.String(v.String()), true
	}
	return q.generic().Find(k)
}

func (q quantityMap) Get(k ref.Val) ref.Val {
	if v, found := q.Find(k); found {
		return v
	}
	return q.generic().Get(k)
}

func (q quantityMap) Contains(k ref.Val) ref.Val {
	if s, ok := k.(types.String); ok {
		_, found := q[ResourceName(s)]
		return types.Bool(found)
	}
	return q.generic().Contains(k)
}

func (q quantityMap) ConvertToNative(t reflect.Type) (any, error) {
	return q.generic().ConvertToNative(t)
}
func (q quantityMap) ConvertToType(t ref.Type) ref.Val { return q.generic().ConvertToType(t) }
func (q quantityMap) Equal(other ref.Val) ref.Val      { return q.generic().Equal(other) }
func (q quantityMap) Iterator() traits.Iterator        { return q.generic().Iterator() }
func (q quantityMap) Size() ref.Val                    { return types.Int(len(q)) }
func (q quantityMap) Type() ref.Type                   { return types.MapType }
func (q quantityMap) Value() any                       { return q.generic().Value() }
