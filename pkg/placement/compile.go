package placement

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// misconfig is a spec error: the placement is PlacementMisconfigured=True and,
// as in OCM, decides nothing until it is fixed.
type misconfig struct {
	field string
	msg   string
}

func (m *misconfig) Error() string { return m.field + ": " + m.msg }

// selector is a compiled label AND claim AND CEL selector (OCM's
// helpers.ClusterSelector). Decision groups have no CEL, as in OCM.
type selector struct {
	label labels.Selector
	// claim is nil when the claim selector is empty (it matches every
	// cluster): most placements select on labels only.
	claim labels.Selector
	cel   []*celProgram
}

// matches tests cluster i of f; the CEL expressions, the costly part, last.
func (s *selector) matches(f *Fleet, i int) bool {
	return s.label.Matches(f.labelSets[i]) && (s.claim == nil || s.claim.Matches(f.claimSets[i])) &&
		(len(s.cel) == 0 || celMatches(s.cel, f, i))
}

// compileSelector compiles a label and a claim selector. field names the
// selector in a misconfig; it is called only then, so a valid placement
// formats no field paths.
func compileSelector(ls *metav1.LabelSelector, cs *ClaimSelector, field func() string) (selector, *misconfig) {
	l, err := labelSelector(ls)
	if err != nil {
		return selector{}, &misconfig{field: field() + ".label_selector", msg: err.Error()}
	}
	s := selector{label: l}
	if len(cs.MatchExpressions) > 0 {
		if s.claim, err = labelSelector(&metav1.LabelSelector{MatchExpressions: cs.MatchExpressions}); err != nil {
			return selector{}, &misconfig{field: field() + ".claim_selector", msg: err.Error()}
		}
	}
	return s, nil
}

// selectorCacheSize bounds the selector memo; past it, it starts over.
const selectorCacheSize = 4096

// labelSelectors memoises metav1.LabelSelectorAsSelector by the selector's
// content. The caller hands Schedule a placement built afresh each round,
// and validating its keys and values (regular expressions, field paths) was
// a tenth of a re-decision and half its allocations; the result depends on
// the content only and is never modified (Matches reads it), so the memo
// cannot change a decision. Only selectors that compile are kept: an
// invalid one is reported afresh, with apimachinery's own message. Like
// celPrograms it outlives fleets, which are rebuilt on every change.
var labelSelectors = struct {
	sync.Mutex
	m map[string]labels.Selector
}{m: map[string]labels.Selector{}}

func labelSelector(ls *metav1.LabelSelector) (labels.Selector, error) {
	if len(ls.MatchLabels)+len(ls.MatchExpressions) == 0 {
		return labels.Everything(), nil
	}
	var kb [256]byte
	key := appendSelectorKey(kb[:0], ls)
	labelSelectors.Lock()
	sel, ok := labelSelectors.m[string(key)]
	labelSelectors.Unlock()
	if ok {
		return sel, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, err
	}
	labelSelectors.Lock()
	if len(labelSelectors.m) >= selectorCacheSize {
		labelSelectors.m = map[string]labels.Selector{}
	}
	labelSelectors.m[string(key)] = sel
	labelSelectors.Unlock()
	return sel, nil
}

// appendSelectorKey appends an encoding of ls that two selectors share only
// if they have the same match labels and the same expressions in the same
// order: every string is length-prefixed, the labels sorted by key.
func appendSelectorKey(b []byte, ls *metav1.LabelSelector) []byte {
	var kb [8]string
	keys := kb[:0]
	for k := range ls.MatchLabels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = strconv.AppendInt(b, int64(len(keys)), 10)
	for _, k := range keys {
		b = appendString(appendString(b, k), ls.MatchLabels[k])
	}
	b = strconv.AppendInt(append(b, '|'), int64(len(ls.MatchExpressions)), 10)
	for _, e := range ls.MatchExpressions {
		b = appendString(appendString(b, e.Key), string(e.Operator))
		b = strconv.AppendInt(append(b, '|'), int64(len(e.Values)), 10)
		for _, v := range e.Values {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = strconv.AppendInt(append(b, '|'), int64(len(s)), 10)
	return append(append(b, ':'), s...)
}

// coordKey is a comparable ScoreCoordinate, so configurations merge as OCM's
// map[ScoreCoordinate]int32 does (a later entry overrides an earlier one).
type coordKey struct {
	typ      ScoreCoordinateType
	builtIn  string
	resource string
	score    string
}

// weighted is an active prioritizer: weight ≠ 0.
type weighted struct {
	name   string
	weight int32
	rule   prioritizer
}

// compiled is a validated placement spec.
type compiled struct {
	predicates   []selector
	prioritizers []weighted
	groups       []selector
}

// compile validates the spec in field order and returns the first problem.
// OCM checks some of these only when clusters are present (its filters return
// early on an empty list) and leaves others to CRD validation; Fleetstream
// has no CRD layer, so everything is checked here, always.
func compile(p *Placement) (*compiled, *misconfig) {
	return compileInto(p, &compiled{})
}

// compileInto is compile reusing c's slices: a round compiles into its
// scratch, so a valid placement costs no allocation there.
func compileInto(p *Placement, c *compiled) (*compiled, *misconfig) {
	if p.NumberOfClusters != nil && *p.NumberOfClusters < 0 {
		return nil, &misconfig{field: "number_of_clusters", msg: fmt.Sprintf("must not be negative, got %d", *p.NumberOfClusters)}
	}
	ps, m := compilePredicates(p, c.predicates[:0])
	if m != nil {
		return nil, m
	}
	c.predicates = ps
	if m := validateTolerations(p.Tolerations); m != nil {
		return nil, m
	}
	ws, m := compilePrioritizers(&p.PrioritizerPolicy, c.prioritizers[:0])
	if m != nil {
		return nil, m
	}
	c.prioritizers = ws
	ds := &p.DecisionStrategy
	c.groups = c.groups[:0]
	if _, m := groupLength(ds.ClustersPerDecisionGroup, 0); m != nil {
		return nil, m
	}
	for i, g := range ds.Groups {
		s, m := compileSelector(&g.GroupClusterSelector.LabelSelector, &g.GroupClusterSelector.ClaimSelector,
			func() string { return fmt.Sprintf("decision_strategy.groups[%d].group_cluster_selector", i) })
		if m != nil {
			return nil, m
		}
		c.groups = append(c.groups, s)
	}
	return c, nil
}

// compilePrioritizers is OCM's getWeights + getPrioritizers: Additive starts
// from Balance 1 and Steady 1, Exact from nothing; configurations override by
// coordinate; weight 0 drops a prioritizer before its name is checked (so an
// unknown built-in at weight 0 is not an error, as in OCM).
func compilePrioritizers(pp *PrioritizerPolicy, out []weighted) ([]weighted, *misconfig) {
	// A policy names a few coordinates: a slice searched in place is
	// OCM's map without a map per round.
	type coordWeight struct {
		k coordKey
		w int32
	}
	var wb [8]coordWeight
	weights := wb[:0]
	set := func(k coordKey, w int32) {
		for i := range weights {
			if weights[i].k == k {
				weights[i].w = w
				return
			}
		}
		weights = append(weights, coordWeight{k, w})
	}
	switch pp.Mode {
	case "", PrioritizerPolicyModeAdditive:
		set(coordKey{typ: ScoreCoordinateTypeBuiltIn, builtIn: PrioritizerBalance}, 1)
		set(coordKey{typ: ScoreCoordinateTypeBuiltIn, builtIn: PrioritizerSteady}, 1)
	case PrioritizerPolicyModeExact:
	default:
		return nil, &misconfig{field: "prioritizer_policy.mode", msg: fmt.Sprintf("incorrect prioritizer policy mode: %s", pp.Mode)}
	}
	for i, cfg := range pp.Configurations {
		f := func(s string) string { return fmt.Sprintf("prioritizer_policy.configurations[%d]%s", i, s) }
		sc := cfg.ScoreCoordinate
		if sc == nil {
			return nil, &misconfig{field: f(".score_coordinate"), msg: "scoreCoordinate field is required"}
		}
		// OCM's CRD bounds the weight; its scheduler would take any value.
		if cfg.Weight < MinWeight || cfg.Weight > MaxWeight {
			return nil, &misconfig{field: f(".weight"), msg: fmt.Sprintf("must be in [%d, %d], got %d", MinWeight, MaxWeight, cfg.Weight)}
		}
		k := coordKey{typ: sc.Type}
		switch sc.Type {
		case "", ScoreCoordinateTypeBuiltIn:
			k.typ = ScoreCoordinateTypeBuiltIn
			k.builtIn = sc.BuiltIn
		case ScoreCoordinateTypeAddOn:
			if sc.AddOn == nil {
				return nil, &misconfig{field: f(".score_coordinate.add_on"), msg: "addOn should not be empty"}
			}
			if sc.AddOn.ResourceName == "" || sc.AddOn.ScoreName == "" {
				return nil, &misconfig{field: f(".score_coordinate.add_on"), msg: "resource_name and score_name are required"}
			}
			k.resource, k.score = sc.AddOn.ResourceName, sc.AddOn.ScoreName
		default:
			return nil, &misconfig{field: f(".score_coordinate.type"), msg: fmt.Sprintf("unknown type %q, want BuiltIn or AddOn", sc.Type)}
		}
		set(k, cfg.Weight)
	}
	for _, kw := range weights {
		k, w := kw.k, kw.w
		if w == 0 {
			continue
		}
		if k.typ != ScoreCoordinateTypeBuiltIn {
			c := AddOnScoreCoordinate{ResourceName: k.resource, ScoreName: k.score}
			out = append(out, weighted{name: addOnPrioritizerName(c), weight: w, rule: addOnScore{coord: c}})
			continue
		}
		rule, ok := builtInPrioritizers[k.builtIn]
		if !ok {
			return nil, &misconfig{field: builtInField(pp, k.builtIn), msg: fmt.Sprintf("incorrect builtin prioritizer: %s", k.builtIn)}
		}
		out = append(out, weighted{name: k.builtIn, weight: w, rule: rule})
	}
	// OCM ranges over a map; the sum does not depend on the order, but the
	// reported per-prioritizer scores should, so sort by name.
	slices.SortFunc(out, func(a, b weighted) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// builtInField finds the configuration that named an unknown built-in, for the condition's field.
func builtInField(pp *PrioritizerPolicy, name string) string {
	for i := len(pp.Configurations) - 1; i >= 0; i-- {
		sc := pp.Configurations[i].ScoreCoordinate
		if sc != nil && (sc.Type == "" || sc.Type == ScoreCoordinateTypeBuiltIn) && sc.BuiltIn == name {
			return fmt.Sprintf("prioritizer_policy.configurations[%d].score_coordinate.built_in", i)
		}
	}
	return "prioritizer_policy.configurations"
}

// groupLength is OCM's calculateLength: a count, or a percentage of total
// rounded up; zero, negative or more than total means total.
func groupLength(v intstr.IntOrString, total int) (int, *misconfig) {
	const field = "decision_strategy.clusters_per_decision_group"
	length := total
	switch v.Type {
	case intstr.Int:
		length = v.IntValue()
	case intstr.String:
		s := v.StrVal
		if !strings.HasSuffix(s, "%") {
			return 0, &misconfig{field: field, msg: fmt.Sprintf("%q invalid type: string is not a percentage", s)}
		}
		f, err := strconv.ParseFloat(s[:len(s)-1], 64)
		if err != nil {
			return 0, &misconfig{field: field, msg: fmt.Sprintf("%q invalid type: string is not a percentage", s)}
		}
		length = ceilInt(f / 100 * float64(total))
	}
	if length <= 0 || length > total {
		length = total
	}
	return length, nil
}
