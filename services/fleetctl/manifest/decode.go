package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// Error is a manifest that cannot be decoded: where it is (file, document, line), which field
// (a path such as spec.taints[0].effect; empty for the document as a whole) and what is wrong.
// The message never quotes a value, which may be a secret.
type Error struct {
	File string
	Doc  int
	Line int
	Path string
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:%d: document %d: ", e.File, e.Line, e.Doc)
	if e.Path != "" {
		b.WriteString(e.Path + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Decode reads every document of a YAML (or JSON) stream named file. Empty documents are
// skipped. It returns the objects of the documents that decoded and, joined, one Error for each
// document that did not (its first problem), so a CI run reports every bad manifest at once. A
// stream that is not YAML stops at the document where it breaks.
func Decode(file string, r io.Reader) ([]*Object, error) {
	dec := yaml.NewDecoder(r)
	var objs []*Object
	var errs []error
	for doc := 1; ; doc++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// yaml.v3 says the line itself ("yaml: line 3: ...").
			errs = append(errs, &Error{File: file, Doc: doc, Msg: "not YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")})
			break
		}
		d := &docDecoder{file: file, doc: doc}
		obj, err := d.decode(&n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if obj != nil {
			objs = append(objs, obj)
		}
	}
	return objs, errors.Join(errs...)
}

type docDecoder struct {
	file string
	doc  int
}

func (d *docDecoder) errorf(n *yaml.Node, path, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &Error{File: d.file, Doc: d.doc, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)}
}

// dnsLabel is an RFC 1123 label, what every Fleetstream name is.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func (d *docDecoder) decode(doc *yaml.Node) (*Object, error) {
	n := doc
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil, nil
		}
		n = n.Content[0]
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, d.errorf(n, "", "want a mapping with apiVersion, kind, metadata and spec, got %s", describe(n))
	}
	fields, err := d.mapping(n, "")
	if err != nil {
		return nil, err
	}
	for _, f := range fields {
		switch f.key {
		case "apiVersion", "kind", "metadata", "spec":
		default:
			return nil, d.errorf(f.keyNode, f.key, "unknown field (want apiVersion, kind, metadata and spec)")
		}
	}
	get := func(key string) *yaml.Node {
		for _, f := range fields {
			if f.key == key {
				return f.value
			}
		}
		return nil
	}
	apiVersion, err := d.requiredString(n, get("apiVersion"), "apiVersion")
	if err != nil {
		return nil, err
	}
	if apiVersion != APIVersion {
		return nil, d.errorf(get("apiVersion"), "apiVersion", "unknown version %q, want %s", apiVersion, APIVersion)
	}
	kindName, err := d.requiredString(n, get("kind"), "kind")
	if err != nil {
		return nil, err
	}
	kind := KindNamed(kindName)
	if kind == nil {
		return nil, d.errorf(get("kind"), "kind", "unknown kind %q, want one of %s", kindName, kindNames())
	}
	obj := &Object{Kind: kind, Source: Source{File: d.file, Doc: d.doc, Line: n.Line}}
	if err := d.metadata(n, get("metadata"), obj); err != nil {
		return nil, err
	}
	spec := kind.Spec.ProtoReflect().New().Interface()
	if s := get("spec"); s != nil && !(s.Kind == yaml.ScalarNode && s.ShortTag() == "!!null") {
		if err := d.message(kind, s, spec.ProtoReflect().Descriptor(), "spec", ""); err != nil {
			return nil, err
		}
		var v any
		if err := s.Decode(&v); err != nil {
			return nil, d.errorf(s, "spec", "%v", err)
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, d.errorf(s, "spec", "%v", err)
		}
		// The walk above has checked every field and type; protojson is the authority on
		// values (an int32 out of range, bad base64), with unknown fields still errors.
		if err := (protojson.UnmarshalOptions{}).Unmarshal(raw, spec); err != nil {
			return nil, d.errorf(s, "spec", "%s", strings.TrimPrefix(err.Error(), "proto: "))
		}
	}
	obj.Spec = spec
	if err := d.semantics(n, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

type mapField struct {
	key     string
	keyNode *yaml.Node
	value   *yaml.Node
}

// mapping returns a mapping's keys and values, refusing keys that are not strings and keys
// given twice (YAML forbids them; yaml.v3 keeps both when decoding into a node).
func (d *docDecoder) mapping(n *yaml.Node, path string) ([]mapField, error) {
	var out []mapField
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			return nil, d.errorf(k, path, "want string keys, got %s", describe(k))
		}
		if seen[k.Value] {
			return nil, d.errorf(k, join(path, k.Value), "given twice")
		}
		seen[k.Value] = true
		out = append(out, mapField{key: k.Value, keyNode: k, value: v})
	}
	return out, nil
}

func (d *docDecoder) requiredString(doc, n *yaml.Node, path string) (string, error) {
	if n == nil {
		return "", d.errorf(doc, path, "required")
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return "", d.errorf(n, path, "want a string, got %s", describe(n))
	}
	return n.Value, nil
}

func (d *docDecoder) metadata(doc, n *yaml.Node, obj *Object) error {
	if n == nil {
		return d.errorf(doc, "metadata", "required")
	}
	if n.Kind != yaml.MappingNode {
		return d.errorf(n, "metadata", "want a mapping, got %s", describe(n))
	}
	fields, err := d.mapping(n, "metadata")
	if err != nil {
		return err
	}
	k := obj.Kind
	for _, f := range fields {
		path := "metadata." + f.key
		switch f.key {
		case "name", "project":
			s, err := d.requiredString(n, f.value, path)
			if err != nil {
				return err
			}
			if !dnsLabel.MatchString(s) {
				return d.errorf(f.value, path, "%q is not a DNS label (lower-case letters, digits and '-', at most 63)", s)
			}
			if f.key == "name" {
				obj.Name = s
			} else {
				if !k.Project {
					return d.errorf(f.keyNode, path, "a %s is fleet-wide, it belongs to no project", k.Name)
				}
				obj.Project = s
			}
		case "labels", "annotations":
			if f.key == "labels" && !k.Labels {
				return d.errorf(f.keyNode, path, "a %s has no labels in the API, so apply could not keep them", k.Name)
			}
			m, err := d.stringMap(f.value, path)
			if err != nil {
				return err
			}
			if f.key == "labels" {
				obj.Labels = m
			} else {
				obj.Annotations = m
			}
		default:
			return d.errorf(f.keyNode, path, "unknown field (want name, project, labels and annotations)")
		}
	}
	if obj.Name == "" && !k.NameOptional {
		return d.errorf(n, "metadata.name", "required")
	}
	if obj.Project == "" && k.Project {
		return d.errorf(n, "metadata.project", "required: a %s belongs to a project", k.Name)
	}
	return nil
}

func (d *docDecoder) stringMap(n *yaml.Node, path string) (map[string]string, error) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, d.errorf(n, path, "want a mapping of strings, got %s", describe(n))
	}
	fields, err := d.mapping(n, path)
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(fields))
	for _, f := range fields {
		if f.value.Kind != yaml.ScalarNode || f.value.ShortTag() != "!!str" {
			return nil, d.errorf(f.value, join(path, f.key), "want a string, got %s (quote it)", describe(f.value))
		}
		m[f.key] = f.value.Value
	}
	return m, nil
}

// message checks mapping n against md: every key a field the manifest may set, every value of
// the field's type. path is the manifest path for messages, ppath the proto-name path that
// Kind.OutputOnly is written in.
func (d *docDecoder) message(k *Kind, n *yaml.Node, md protoreflect.MessageDescriptor, path, ppath string) error {
	if n.Kind != yaml.MappingNode {
		return d.errorf(n, path, "want a mapping, got %s", describe(n))
	}
	fields, err := d.mapping(n, path)
	if err != nil {
		return err
	}
	for _, f := range fields {
		fpath := join(path, f.key)
		fd := k.field(md, ppath, f.key)
		if fd == nil {
			return d.errorf(f.keyNode, fpath, "unknown field%s", k.known(md, ppath))
		}
		if f.value.Kind == yaml.ScalarNode && f.value.ShortTag() == "!!null" {
			continue
		}
		fp := string(fd.Name())
		if ppath != "" {
			fp = ppath + "." + fp
		}
		switch {
		case fd.IsMap():
			if f.value.Kind != yaml.MappingNode {
				return d.errorf(f.value, fpath, "want a mapping, got %s", describe(f.value))
			}
			entries, err := d.mapping(f.value, fpath)
			if err != nil {
				return err
			}
			for _, e := range entries {
				if err := d.value(k, fd.MapValue(), e.value, join(fpath, e.key), fp); err != nil {
					return err
				}
			}
		case fd.IsList():
			if f.value.Kind != yaml.SequenceNode {
				return d.errorf(f.value, fpath, "want a list, got %s", describe(f.value))
			}
			for i, e := range f.value.Content {
				if err := d.value(k, fd, e, fmt.Sprintf("%s[%d]", fpath, i), fp); err != nil {
					return err
				}
			}
		default:
			if err := d.value(k, fd, f.value, fpath, fp); err != nil {
				return err
			}
		}
	}
	return nil
}

// value checks one value (a singular field, a list element or a map value) against fd's type.
func (d *docDecoder) value(k *Kind, fd protoreflect.FieldDescriptor, n *yaml.Node, path, ppath string) error {
	if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
		return d.message(k, n, fd.Message(), path, ppath)
	}
	want, tags := scalarType(fd)
	if n.Kind != yaml.ScalarNode || !tags[n.ShortTag()] {
		hint := ""
		if tags["!!str"] && n.Kind == yaml.ScalarNode {
			hint = " (quote it)"
		}
		return d.errorf(n, path, "want %s, got %s%s", want, describe(n), hint)
	}
	if fd.Kind() == protoreflect.EnumKind && fd.Enum().Values().ByName(protoreflect.Name(n.Value)) == nil {
		return d.errorf(n, path, "unknown value %q, want one of %s", n.Value, enumNames(fd.Enum()))
	}
	return nil
}

// scalarType is what a scalar field accepts: words for messages and the YAML tags.
func scalarType(fd protoreflect.FieldDescriptor) (string, map[string]bool) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return "true or false", map[string]bool{"!!bool": true}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return "an integer", map[string]bool{"!!int": true}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		// The API's JSON writes 64-bit integers as strings; both read back.
		return "an integer", map[string]bool{"!!int": true, "!!str": true}
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return "a number", map[string]bool{"!!int": true, "!!float": true}
	case protoreflect.EnumKind:
		return "one of " + enumNames(fd.Enum()), map[string]bool{"!!str": true}
	default: // string, bytes (base64)
		return "a string", map[string]bool{"!!str": true}
	}
}

func enumNames(ed protoreflect.EnumDescriptor) string {
	var names []string
	for i := 0; i < ed.Values().Len(); i++ {
		v := ed.Values().Get(i)
		if v.Number() == 0 {
			continue // UNSPECIFIED: the same as leaving the field out
		}
		names = append(names, string(v.Name()))
	}
	return strings.Join(names, ", ")
}

// known lists the fields a manifest may set in md, for an unknown-field message.
func (k *Kind) known(md protoreflect.MessageDescriptor, ppath string) string {
	var names []string
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		if k.settable(ppath, fd) {
			names = append(names, fd.JSONName())
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " (want " + strings.Join(names, ", ") + ")"
}

// describe names a node's type for messages, without its value (which may be a secret).
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	switch n.ShortTag() {
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "null"
	}
	return n.ShortTag()
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// semantics checks what the types cannot say: the fields a kind requires and the ones that
// exclude each other.
func (d *docDecoder) semantics(n *yaml.Node, obj *Object) error {
	switch s := obj.Spec.(type) {
	case *projectv1.NamespaceBinding:
		if (s.Cluster == "") == (s.Placement == "") {
			return d.errorf(n, "spec", "want exactly one of cluster and placement")
		}
	case *rbacv1.ProjectRoleBinding:
		if s.RoleTemplate == "" {
			return d.errorf(n, "spec.roleTemplate", "required")
		}
		if s.Subject.GetName() == "" {
			return d.errorf(n, "spec.subject.name", "required")
		}
		if s.Subject.GetKind() == rbacv1.SubjectKind_SUBJECT_KIND_UNSPECIFIED {
			return d.errorf(n, "spec.subject.kind", "required")
		}
	case *placementv1.ClusterSetBinding:
		if s.ClusterSet == "" {
			return d.errorf(n, "spec.clusterSet", "required")
		}
	case *endpointv1.ServiceWeights:
		return d.serviceWeights(n, s)
	case *clusterv1.ImportPolicy:
		if path := literalCredential(s.Template); path != "" {
			return d.errorf(n, "spec.template", "%s holds a literal value where a reference is expected ({{ .references.<key>... }}): a secret does not belong in a manifest (the value is not shown)", path)
		}
	}
	return nil
}

// literalCredential returns the path of the first credential in an import policy's template
// that is written out rather than taken from a reference, or "" when there is none (or the
// template is not YAML before rendering, which the API checks).
func literalCredential(template string) string {
	var t struct {
		Credentials map[string]any `yaml:"credentials"`
	}
	if yaml.Unmarshal([]byte(template), &t) != nil {
		return ""
	}
	for _, k := range slices.Sorted(maps.Keys(t.Credentials)) {
		v, ok := t.Credentials[k].(string)
		if t.Credentials[k] != nil && (!ok || (v != "" && !strings.Contains(v, "{{"))) {
			return "credentials." + k
		}
	}
	return ""
}

// maxWeight is the API's bound on a weight (endpoint.v1: 0..65535).
const maxWeight = 65535

// serviceWeights checks a ServiceWeights spec and writes it in the API's form, so that an
// unchanged manifest compares equal to what the API lists: IPs spelled as the API spells them,
// endpoint weights in its order, and a cluster weight of 100 (the default, which the API keeps
// no entry for) left out.
func (d *docDecoder) serviceWeights(n *yaml.Node, s *endpointv1.ServiceWeights) error {
	if s.Namespace == "" {
		return d.errorf(n, "spec.namespace", "required")
	}
	if !dnsLabel.MatchString(s.Namespace) {
		return d.errorf(n, "spec.namespace", "%q is not a DNS label (lower-case letters, digits and '-', at most 63)", s.Namespace)
	}
	for _, c := range slices.Sorted(maps.Keys(s.ClusterWeights)) {
		path := "spec.clusterWeights[" + c + "]"
		if !dnsLabel.MatchString(c) {
			return d.errorf(n, path, "%q is not a cluster name (a DNS label)", c)
		}
		if w := s.ClusterWeights[c]; w > maxWeight {
			return d.errorf(n, path, "%d is more than %d", w, maxWeight)
		} else if w == 100 {
			delete(s.ClusterWeights, c)
		}
	}
	seen := map[string]bool{}
	for i, e := range s.EndpointWeights {
		path := fmt.Sprintf("spec.endpointWeights[%d]", i)
		ip, err := netip.ParseAddr(e.Ip)
		switch {
		case e.Ip == "":
			return d.errorf(n, path+".ip", "required")
		case err != nil || ip.Zone() != "":
			return d.errorf(n, path+".ip", "%q is not an IP address", e.Ip)
		case e.ClusterName == "":
			return d.errorf(n, path+".clusterName", "required: an endpoint weight binds to the endpoint serving the IP in one cluster")
		case !dnsLabel.MatchString(e.ClusterName):
			return d.errorf(n, path+".clusterName", "%q is not a cluster name (a DNS label)", e.ClusterName)
		case e.Weight > maxWeight:
			return d.errorf(n, path+".weight", "%d is more than %d", e.Weight, maxWeight)
		}
		e.Ip = ip.Unmap().String()
		id := e.ClusterName + "/" + e.Ip
		if seen[id] {
			return d.errorf(n, path, "a second weight for %s in cluster %s", e.Ip, e.ClusterName)
		}
		seen[id] = true
	}
	SortEndpointWeights(s.EndpointWeights)
	if len(s.ClusterWeights) == 0 {
		s.ClusterWeights = nil
	}
	return nil
}

// SortEndpointWeights puts endpoint weights in the order the API lists them: by cluster, then IP.
func SortEndpointWeights(ws []*endpointv1.EndpointWeight) {
	slices.SortFunc(ws, func(a, b *endpointv1.EndpointWeight) int {
		return strings.Compare(a.ClusterName+"\x00"+a.Ip, b.ClusterName+"\x00"+b.Ip)
	})
}
