// Package importpolicy is the rendering engine of import policies (Clusterpedia's
// ClusterImportPolicy, made safer): it validates a policy, resolves the references a source
// object needs in dependency order, and renders the cluster name, the cluster and the creation
// condition in a sandbox bounded in time and size. It knows nothing of the API, NATS or agents:
// cluster-import calls it from its API (validation, preview) and from its lifecycles.
//
// See docs/import-policies.md for the template data model and the differences from Clusterpedia.
package importpolicy

import (
	"fmt"
	"regexp"
	"strings"
	"text/template"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleetstream/fleetstream/pkg/kubecreds"
)

// ImportPolicy says how objects of one source type become clusters. Field names mirror the
// proto message fleetstream.cluster.v1.ImportPolicy; JSON names are protojson's.
type ImportPolicy struct {
	Name       string      `json:"name"`
	Source     Source      `json:"source"`
	References []Reference `json:"references,omitempty"`
	// NameTemplate renders the lifecycle's and the cluster's name; it sees .source only.
	NameTemplate string `json:"nameTemplate"`
	// Template renders the cluster document (see ClusterDocument).
	Template string `json:"template"`
	// CreationCondition renders "true" (trimmed, any case) when the cluster may be created.
	CreationCondition string `json:"creationCondition"`
}

// Source is the type of object the policy watches on the inventory cluster.
type Source struct {
	// Cluster is the registered cluster whose agent watches the source type.
	Cluster  string `json:"cluster"`
	Group    string `json:"group"`
	Version  string `json:"version,omitempty"`
	Resource string `json:"resource"`
	// Namespace limits the watch to one namespace; empty means all.
	Namespace string `json:"namespace,omitempty"`
	// SelectorTemplate renders "true" for the objects the policy imports; empty selects all.
	// It sees .source only.
	SelectorTemplate string `json:"selectorTemplate,omitempty"`
}

// Reference is a further object the rendering needs, found by the namespace and name its
// templates render. A reference may use earlier ones through .references.<key>.
type Reference struct {
	Key               string `json:"key"`
	Group             string `json:"group"`
	Version           string `json:"version,omitempty"`
	Resource          string `json:"resource"`
	NamespaceTemplate string `json:"namespaceTemplate,omitempty"`
	NameTemplate      string `json:"nameTemplate"`
}

// IsSecret reports whether the reference reads core Secrets, whose values are never shown.
func (r Reference) IsSecret() bool { return r.Group == "" && r.Resource == "secrets" }

// Reasons of field errors and conditions. The lifecycle shows them; callers may switch on them.
const (
	ReasonInvalidPolicy     = "InvalidPolicy"
	ReasonInvalidTemplate   = "InvalidTemplate"
	ReasonInvalidSource     = "InvalidSource"
	ReasonNotSelected       = "NotSelected"
	ReasonReferenceNotFound = "ReferenceNotFound"
	ReasonReferenceInvalid  = "ReferenceInvalid"
	ReasonTemplateFailed    = "TemplateFailed"
	ReasonRenderTimeout     = "RenderTimeout"
	ReasonRenderTooLarge    = "RenderTooLarge"
	ReasonInvalidName       = "InvalidName"
	ReasonInvalidCluster    = "InvalidCluster"
	// ReasonSecretDerived: a name, label, claim or taint was computed from a Secret's data.
	ReasonSecretDerived = "SecretDerived"
)

// LabelAllowImportCredentials on a cluster lets an adopting import replace its credentials
// (docs/import.md, "Adoption and credentials"). It is a platform admin's consent, so a rendered
// cluster never carries it.
const LabelAllowImportCredentials = "fleetstream.io/allow-import-credentials"

// FieldError is one problem with the field path it concerns, e.g.
// "references[1].name_template". Paths use the proto field names, as Connect errors do.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
	// Reason classifies the problem (one of the Reason constants).
	Reason string `json:"reason,omitempty"`
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

func fieldErr(field, reason, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// FieldErrors is a list of problems; as an error it reads "field: message; field: message".
type FieldErrors []*FieldError

func (es FieldErrors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

// Err returns nil for an empty list, so a FieldErrors never becomes a non-nil empty error.
func (es FieldErrors) Err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// maxFieldErrors is how many problems a validation lists; a policy with a thousand bad
// references gets an answer of a few lines.
const maxFieldErrors = 20

func (es *FieldErrors) add(e *FieldError) {
	if len(*es) < maxFieldErrors {
		*es = append(*es, e)
	}
}

// Engine validates and renders import policies within Limits. It holds no state between
// calls and is safe for concurrent use.
type Engine struct {
	limits Limits
	funcs  template.FuncMap
	// creds is what a rendered kubeconfig may hold beyond inline data (pkg/kubecreds).
	creds kubecreds.Policy
}

// NewEngine returns an engine with the given limits; zero fields take DefaultLimits' values.
func NewEngine(l Limits) *Engine {
	d := DefaultLimits()
	if l.Timeout <= 0 {
		l.Timeout = d.Timeout
	}
	if l.MaxOutputBytes <= 0 {
		l.MaxOutputBytes = d.MaxOutputBytes
	}
	if l.MaxSteps <= 0 {
		l.MaxSteps = d.MaxSteps
	}
	if l.MaxValueBytes <= 0 {
		l.MaxValueBytes = d.MaxValueBytes
	}
	if l.MaxAllocBytes <= 0 {
		l.MaxAllocBytes = d.MaxAllocBytes
	}
	if l.MaxObjectBytes <= 0 {
		l.MaxObjectBytes = d.MaxObjectBytes
	}
	return &Engine{limits: l, funcs: baseFuncs()}
}

// WithCredentialsPolicy returns a copy of e whose renders check a rendered kubeconfig with p,
// as the registry will when it stores it, so a refused field shows as a render error.
func (e *Engine) WithCredentialsPolicy(p kubecreds.Policy) *Engine {
	c := *e
	c.creds = p
	return &c
}

// Limits returns the engine's limits.
func (e *Engine) Limits() Limits { return e.limits }

// Compiled is a validated policy with its templates parsed and its references in dependency
// order. Compile once per policy revision; render many source objects with it.
type Compiled struct {
	Policy ImportPolicy
	// Order lists indexes into Policy.References in an order where every reference comes
	// after the references its templates read.
	Order []int

	selector, name, template, condition *compiled
	refNamespace, refName               []*compiled
}

var keyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate checks p and returns its problems with field paths, or nil.
func (e *Engine) Validate(p *ImportPolicy) FieldErrors {
	_, errs := e.Compile(p)
	return errs
}

// Compile validates p and parses its templates. On problems it returns them all (up to a
// bound) with field paths and reason InvalidPolicy or InvalidTemplate.
func (e *Engine) Compile(p *ImportPolicy) (*Compiled, FieldErrors) {
	var errs FieldErrors
	c := &Compiled{Policy: *p}
	c.Policy.References = append([]Reference(nil), p.References...)

	dns := func(field, v string, required bool) {
		if v == "" {
			if required {
				errs.add(fieldErr(field, ReasonInvalidPolicy, "required"))
			}
			return
		}
		for _, m := range validation.IsDNS1123Label(v) {
			errs.add(fieldErr(field, ReasonInvalidPolicy, "%s: %s", short(v), m))
		}
	}
	group := func(field, v string) {
		if v == "" {
			return
		}
		for _, m := range validation.IsDNS1123Subdomain(v) {
			errs.add(fieldErr(field, ReasonInvalidPolicy, "%s: %s", short(v), m))
		}
	}
	dns("name", p.Name, true)
	dns("source.cluster", p.Source.Cluster, true)
	group("source.group", p.Source.Group)
	dns("source.version", p.Source.Version, false)
	dns("source.resource", p.Source.Resource, true)
	dns("source.namespace", p.Source.Namespace, false)

	parse := func(field, text string, required bool) *compiled {
		if strings.TrimSpace(text) == "" {
			if required {
				errs.add(fieldErr(field, ReasonInvalidPolicy, "required"))
			}
			return nil
		}
		if len(text) > maxTemplateBytes {
			errs.add(fieldErr(field, ReasonInvalidTemplate, "%d bytes, at most %d", len(text), maxTemplateBytes))
			return nil
		}
		t, err := compile(field, text, e.funcs)
		if err != nil {
			if fe, ok := err.(*FieldError); ok {
				errs.add(fe)
			} else {
				errs.add(fieldErr(field, ReasonInvalidTemplate, "%v", err))
			}
			return nil
		}
		return t
	}
	sourceOnly := func(t *compiled) {
		if t != nil && (t.refs.dynamic || len(t.refs.keys) > 0) {
			errs.add(fieldErr(t.field, ReasonInvalidTemplate, "sees .source only, not .references"))
		}
	}
	c.selector = parse("source.selector_template", p.Source.SelectorTemplate, false)
	sourceOnly(c.selector)
	c.name = parse("name_template", p.NameTemplate, true)
	sourceOnly(c.name)
	c.template = parse("template", p.Template, true)
	c.condition = parse("creation_condition", p.CreationCondition, true)

	if len(p.References) > maxReferences {
		errs.add(fieldErr("references", ReasonInvalidPolicy, "%d references, at most %d", len(p.References), maxReferences))
		return nil, errs
	}
	keys := map[string]int{}
	for i, r := range p.References {
		f := fmt.Sprintf("references[%d]", i)
		switch {
		case r.Key == "":
			errs.add(fieldErr(f+".key", ReasonInvalidPolicy, "required"))
		case !keyRE.MatchString(r.Key):
			errs.add(fieldErr(f+".key", ReasonInvalidPolicy, "%s: letters, digits and _ only, not starting with a digit, so that .references.<key> works", short(r.Key)))
		default:
			if j, dup := keys[r.Key]; dup {
				errs.add(fieldErr(f+".key", ReasonInvalidPolicy, "%s is also the key of references[%d]", short(r.Key), j))
			}
			keys[r.Key] = i
		}
		group(f+".group", r.Group)
		dns(f+".version", r.Version, false)
		dns(f+".resource", r.Resource, true)
		c.refNamespace = append(c.refNamespace, parse(f+".namespace_template", r.NamespaceTemplate, false))
		c.refName = append(c.refName, parse(f+".name_template", r.NameTemplate, true))
	}
	// Templates of the cluster may read any reference, but only ones that exist.
	for _, t := range []*compiled{c.template, c.condition} {
		if t == nil {
			continue
		}
		for _, k := range sortedKeys(t.refs.keys) {
			if _, ok := keys[k]; !ok {
				errs.add(fieldErr(t.field, ReasonInvalidTemplate, ".references.%s: no reference has key %s", k, short(k)))
			}
		}
	}
	if len(errs) == 0 {
		order, err := referenceOrder(c, keys)
		if err != nil {
			errs.add(err)
		}
		c.Order = order
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return c, nil
}

// Bounds of a policy's shape; a policy is configuration, far below these in practice.
const (
	maxTemplateBytes = 64 << 10
	maxReferences    = 16
)

// referenceOrder sorts the references so that each comes after the ones its templates read,
// keeping the written order where dependencies allow (so Clusterpedia's policies, which may
// only read earlier references, resolve in the order written). A cycle or an unknown key is an
// error on the first template concerned.
func referenceOrder(c *Compiled, keys map[string]int) ([]int, *FieldError) {
	n := len(c.Policy.References)
	deps := make([][]int, n)
	for i := range n {
		for _, t := range []*compiled{c.refNamespace[i], c.refName[i]} {
			if t == nil {
				continue
			}
			if t.refs.dynamic {
				return nil, fieldErr(t.field, ReasonInvalidTemplate, "reads .references as a whole; name each reference (.references.<key>) so the order of fetching is known")
			}
			for _, k := range sortedKeys(t.refs.keys) {
				j, ok := keys[k]
				if !ok {
					return nil, fieldErr(t.field, ReasonInvalidTemplate, ".references.%s: no reference has key %s", k, short(k))
				}
				if j == i {
					return nil, fieldErr(t.field, ReasonInvalidTemplate, ".references.%s: a reference cannot read itself", k)
				}
				deps[i] = append(deps[i], j)
			}
		}
	}
	placed := make([]bool, n)
	order := make([]int, 0, n)
	for len(order) < n {
		progress := false
		for i := range n {
			if placed[i] {
				continue
			}
			ready := true
			for _, j := range deps[i] {
				ready = ready && placed[j]
			}
			if ready {
				placed[i], progress = true, true
				order = append(order, i)
				break // restart from the first, to keep the written order
			}
		}
		if !progress {
			for i := range n {
				if !placed[i] {
					cycle := findCycle(deps, placed, i, c.Policy.References)
					return nil, fieldErr(fmt.Sprintf("references[%d]", i), ReasonInvalidPolicy, "references form a cycle: %s", cycle)
				}
			}
		}
	}
	return order, nil
}

// findCycle describes a dependency cycle reachable from start, as "a → b → a". Every
// reference left unplaced has an unplaced dependency (or it would be ready), so following those
// must come back to a reference already on the path.
func findCycle(deps [][]int, placed []bool, start int, refs []Reference) string {
	seen := map[int]int{}
	path := []int{}
	cur := start
	for {
		if at, ok := seen[cur]; ok {
			names := []string{}
			for _, i := range path[at:] {
				names = append(names, refs[i].Key)
			}
			return strings.Join(append(names, refs[cur].Key), " → ")
		}
		seen[cur] = len(path)
		path = append(path, cur)
		next := -1
		for _, d := range deps[cur] {
			if !placed[d] {
				next = d
				break
			}
		}
		if next < 0 {
			return refs[start].Key
		}
		cur = next
	}
}
