package cli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
)

// The placement file is an OCM Placement (cluster.open-cluster-management.io/v1beta1) as users
// write it, so an OCM placement is copied over with its spec untouched: the same camelCase
// names, the same enum spellings. The project may be given as OCM's metadata.namespace or as a
// top-level project (the API's name for it). Decoding is strict: an unknown or misspelt field
// is an error naming its path, since a field silently dropped would place work on clusters the
// author excluded.

const ocmPlacementAPIVersion = "cluster.open-cluster-management.io/v1beta1"

type placementFile struct {
	APIVersion string             `json:"apiVersion,omitempty"`
	Kind       string             `json:"kind,omitempty"`
	Project    string             `json:"project,omitempty"`
	Name       string             `json:"name,omitempty"`
	Metadata   *placementMetadata `json:"metadata,omitempty"`
	Spec       *ocmPlacementSpec  `json:"spec,omitempty"`
}

type placementMetadata struct {
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

type ocmPlacementSpec struct {
	ClusterSets       []string              `json:"clusterSets,omitempty"`
	NumberOfClusters  *int32                `json:"numberOfClusters,omitempty"`
	Predicates        []ocmPredicate        `json:"predicates,omitempty"`
	Tolerations       []ocmToleration       `json:"tolerations,omitempty"`
	PrioritizerPolicy *ocmPrioritizerPolicy `json:"prioritizerPolicy,omitempty"`
	DecisionStrategy  *ocmDecisionStrategy  `json:"decisionStrategy,omitempty"`
}

type ocmPredicate struct {
	RequiredClusterSelector *ocmPredicateSelector `json:"requiredClusterSelector,omitempty"`
}

// ocmClusterSelector is OCM's GroupClusterSelector: the label and claim selectors.
type ocmClusterSelector struct {
	LabelSelector *ocmLabelSelector `json:"labelSelector,omitempty"`
	ClaimSelector *ocmClaimSelector `json:"claimSelector,omitempty"`
}

// ocmPredicateSelector is OCM's ClusterSelector: a group's selectors and a CEL selector (which
// decision groups do not have, in OCM either).
type ocmPredicateSelector struct {
	ocmClusterSelector
	CelSelector *ocmCelSelector `json:"celSelector,omitempty"`
}

type ocmCelSelector struct {
	CelExpressions []string `json:"celExpressions,omitempty"`
}

type ocmLabelSelector struct {
	MatchLabels      map[string]string        `json:"matchLabels,omitempty"`
	MatchExpressions []ocmSelectorRequirement `json:"matchExpressions,omitempty"`
}

type ocmClaimSelector struct {
	MatchExpressions []ocmSelectorRequirement `json:"matchExpressions,omitempty"`
}

type ocmSelectorRequirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values,omitempty"`
}

type ocmToleration struct {
	Key               string `json:"key,omitempty"`
	Operator          string `json:"operator,omitempty"`
	Value             string `json:"value,omitempty"`
	Effect            string `json:"effect,omitempty"`
	TolerationSeconds *int64 `json:"tolerationSeconds,omitempty"`
}

type ocmPrioritizerPolicy struct {
	Mode           string                 `json:"mode,omitempty"`
	Configurations []ocmPrioritizerConfig `json:"configurations,omitempty"`
}

type ocmPrioritizerConfig struct {
	ScoreCoordinate *ocmScoreCoordinate `json:"scoreCoordinate,omitempty"`
	Weight          *int32              `json:"weight,omitempty"`
}

type ocmScoreCoordinate struct {
	Type    string      `json:"type,omitempty"`
	BuiltIn string      `json:"builtIn,omitempty"`
	AddOn   *ocmAddOnID `json:"addOn,omitempty"`
}

type ocmAddOnID struct {
	ResourceName string `json:"resourceName"`
	ScoreName    string `json:"scoreName"`
}

type ocmDecisionStrategy struct {
	GroupStrategy *ocmGroupStrategy `json:"groupStrategy,omitempty"`
}

type ocmGroupStrategy struct {
	DecisionGroups []ocmDecisionGroup `json:"decisionGroups,omitempty"`
	// OCM's IntOrString: 3 or "25%".
	ClustersPerDecisionGroup *intstr.IntOrString `json:"clustersPerDecisionGroup,omitempty"`
}

type ocmDecisionGroup struct {
	GroupName            string              `json:"groupName,omitempty"`
	GroupClusterSelector *ocmClusterSelector `json:"groupClusterSelector,omitempty"`
}

// scoreCoordinateTypes are OCM's spellings of ScoreCoordinate.type.
var scoreCoordinateTypes = map[string]placementv1.ScoreCoordinateType{
	"BuiltIn": placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_BUILT_IN,
	"AddOn":   placementv1.ScoreCoordinateType_SCORE_COORDINATE_TYPE_ADD_ON,
}

// readPlacements reads the placements of a file (or "-" for standard input): one per YAML
// document, or a JSON object. project is --project: it fills in a document without a project
// and must agree with one that has it.
func readPlacements(f *factory, path, project string) ([]*placementv1.Placement, error) {
	data, err := readFileOrStdin(path, f.streams.In)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	name := path
	if path == "-" {
		name = "<stdin>"
	}
	return parsePlacements(name, data, project)
}

// parsePlacements is readPlacements on the file's contents; errors start with name.
func parsePlacements(name string, data []byte, project string) ([]*placementv1.Placement, error) {
	docs, err := splitYAMLDocuments(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("%s: no placement in the file", name)
	}
	var out []*placementv1.Placement
	for i, doc := range docs {
		where := name
		if len(docs) > 1 {
			where = fmt.Sprintf("%s (document %d)", name, i+1)
		}
		p, err := parsePlacement(doc, project)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// splitYAMLDocuments splits a stream at "---" lines, dropping documents that hold only
// comments or whitespace.
func splitYAMLDocuments(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, err
		}
		if t := bytes.TrimSpace(js); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
			docs = append(docs, js)
		}
	}
}

// parsePlacement translates one document, already converted to JSON. Error messages name the
// offending field by its path in the file.
func parsePlacement(js []byte, project string) (*placementv1.Placement, error) {
	var doc placementFile
	strictErrs, err := kjson.UnmarshalStrict(js, &doc, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, decodeError(err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, e := range strictErrs {
			msgs[i] = e.Error()
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	if doc.APIVersion != "" && doc.APIVersion != ocmPlacementAPIVersion {
		return nil, fmt.Errorf("apiVersion: %q is not supported, want %s or none", doc.APIVersion, ocmPlacementAPIVersion)
	}
	if doc.Kind != "" && doc.Kind != "Placement" {
		return nil, fmt.Errorf("kind: %q is not a placement, want Placement or none", doc.Kind)
	}
	meta := doc.Metadata
	if meta == nil {
		meta = &placementMetadata{}
	}
	name, err := oneOf("name", doc.Name, "metadata.name", meta.Name)
	if err != nil {
		return nil, err
	}
	if name == "" {
		return nil, errors.New("name: required (name or metadata.name)")
	}
	proj, err := oneOf("project", doc.Project, "metadata.namespace", meta.Namespace)
	if err != nil {
		return nil, err
	}
	switch {
	case proj == "" && project == "":
		return nil, errors.New("project: required (project, metadata.namespace or --project)")
	case proj == "":
		proj = project
	case project != "" && project != proj:
		return nil, fmt.Errorf("project: the file says %q, --project says %q", proj, project)
	}
	p := &placementv1.Placement{Project: proj, Name: name}
	if doc.Spec != nil {
		if err := doc.Spec.fill(p); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// oneOf returns the value given under either of two names, refusing two different values.
func oneOf(nameA, a, nameB, b string) (string, error) {
	if a != "" && b != "" && a != b {
		return "", fmt.Errorf("%s %q and %s %q disagree; give one", nameA, a, nameB, b)
	}
	if a != "" {
		return a, nil
	}
	return b, nil
}

// decodeError rewords the decoder's type errors, which name the Go struct holding the field
// ("Go struct field placementFile.spec.numberOfClusters of type int32"), into the field's
// path alone.
func decodeError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "json: ")
	const into = " into Go struct field "
	if before, rest, ok := strings.Cut(msg, into); ok {
		field, typ, _ := strings.Cut(rest, " of type ")
		if _, path, ok := strings.Cut(field, "."); ok {
			field = path
		}
		got := strings.TrimPrefix(before, "cannot unmarshal ")
		if got == "bool" && typ == "string" {
			// YAML reads true, yes and on unquoted as booleans; a toleration value is a string.
			return fmt.Errorf("%s: got %s, want %s (quote it)", field, got, typ)
		}
		return fmt.Errorf("%s: got %s, want %s", field, got, typ)
	}
	return errors.New(msg)
}

func (s *ocmPlacementSpec) fill(p *placementv1.Placement) error {
	p.ClusterSets = s.ClusterSets
	p.NumberOfClusters = s.NumberOfClusters
	for _, pr := range s.Predicates {
		out := &placementv1.Predicate{}
		if cs := pr.RequiredClusterSelector; cs != nil {
			out.RequiredClusterSelector = &placementv1.ClusterSelector{
				LabelSelector: cs.LabelSelector.proto(),
				ClaimSelector: cs.ClaimSelector.proto(),
			}
			if cs.CelSelector != nil {
				out.RequiredClusterSelector.CelSelector = &placementv1.CelSelector{CelExpressions: cs.CelSelector.CelExpressions}
			}
		}
		p.Predicates = append(p.Predicates, out)
	}
	for _, t := range s.Tolerations {
		p.Tolerations = append(p.Tolerations, &placementv1.Toleration{
			Key: t.Key, Operator: t.Operator, Value: t.Value, Effect: t.Effect, TolerationSeconds: t.TolerationSeconds,
		})
	}
	if pp := s.PrioritizerPolicy; pp != nil {
		p.PrioritizerPolicy = &placementv1.PrioritizerPolicy{Mode: pp.Mode}
		for i, c := range pp.Configurations {
			out := &placementv1.PrioritizerConfig{Weight: c.Weight}
			if sc := c.ScoreCoordinate; sc != nil {
				out.ScoreCoordinate = &placementv1.ScoreCoordinate{BuiltIn: sc.BuiltIn}
				if sc.Type != "" {
					typ, ok := scoreCoordinateTypes[sc.Type]
					if !ok {
						return fmt.Errorf("spec.prioritizerPolicy.configurations[%d].scoreCoordinate.type: unknown type %q, want BuiltIn or AddOn", i, sc.Type)
					}
					out.ScoreCoordinate.Type = typ
				}
				if a := sc.AddOn; a != nil {
					out.ScoreCoordinate.AddOn = &placementv1.AddOnScoreCoordinate{ResourceName: a.ResourceName, ScoreName: a.ScoreName}
				}
			}
			p.PrioritizerPolicy.Configurations = append(p.PrioritizerPolicy.Configurations, out)
		}
	}
	if ds := s.DecisionStrategy; ds != nil && ds.GroupStrategy != nil {
		gs := ds.GroupStrategy
		p.DecisionStrategy = &placementv1.DecisionStrategy{}
		if gs.ClustersPerDecisionGroup != nil {
			p.DecisionStrategy.ClustersPerDecisionGroup = gs.ClustersPerDecisionGroup.String()
		}
		for _, g := range gs.DecisionGroups {
			out := &placementv1.DecisionGroup{GroupName: g.GroupName}
			if sel := g.GroupClusterSelector; sel != nil {
				out.GroupClusterSelector = &placementv1.GroupClusterSelector{
					LabelSelector: sel.LabelSelector.proto(),
					ClaimSelector: sel.ClaimSelector.proto(),
				}
			}
			p.DecisionStrategy.Groups = append(p.DecisionStrategy.Groups, out)
		}
	}
	return nil
}

func (ls *ocmLabelSelector) proto() *placementv1.LabelSelector {
	if ls == nil {
		return nil
	}
	return &placementv1.LabelSelector{MatchLabels: ls.MatchLabels, MatchExpressions: requirements(ls.MatchExpressions)}
}

func (cs *ocmClaimSelector) proto() *placementv1.ClaimSelector {
	if cs == nil {
		return nil
	}
	return &placementv1.ClaimSelector{MatchExpressions: requirements(cs.MatchExpressions)}
}

// requirements copies selector expressions as written: the server checks operators and values
// and names the field, so a second copy of those rules here could only drift.
func requirements(rs []ocmSelectorRequirement) []*placementv1.LabelSelectorRequirement {
	var out []*placementv1.LabelSelectorRequirement
	for _, r := range rs {
		out = append(out, &placementv1.LabelSelectorRequirement{Key: r.Key, Operator: r.Operator, Values: r.Values})
	}
	return out
}
