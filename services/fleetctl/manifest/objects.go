package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// Key is the object's identity in the API: two manifests with the same key declare the same
// object. Most kinds are their name (and project); bindings are what they bind.
func (o *Object) Key() string {
	switch s := o.Spec.(type) {
	case *projectv1.NamespaceBinding:
		if s.Placement != "" {
			return fmt.Sprintf("NamespaceBinding/%s/placement=%s/%s", o.Project, s.Placement, o.Name)
		}
		return fmt.Sprintf("NamespaceBinding/%s/cluster=%s/%s", o.Project, s.Cluster, o.Name)
	case *placementv1.ClusterSetBinding:
		return fmt.Sprintf("ClusterSetBinding/%s/%s", o.Project, s.ClusterSet)
	case *rbacv1.ProjectRoleBinding:
		return fmt.Sprintf("ProjectRoleBinding/%s/%s/%s", o.Project, s.RoleTemplate, SubjectString(s.Subject))
	case *endpointv1.ServiceWeights:
		return fmt.Sprintf("ServiceWeights/%s/%s", s.Namespace, o.Name)
	}
	if o.Kind.Project {
		return o.Kind.Name + "/" + o.Project + "/" + o.Name
	}
	return o.Kind.Name + "/" + o.Name
}

// SubjectString is a subject as people write it: user:alice, group:dev, serviceaccount:ns:name.
func SubjectString(s *rbacv1.Subject) string {
	switch s.GetKind() {
	case rbacv1.SubjectKind_SUBJECT_KIND_USER:
		return "user:" + s.GetName()
	case rbacv1.SubjectKind_SUBJECT_KIND_GROUP:
		return "group:" + s.GetName()
	case rbacv1.SubjectKind_SUBJECT_KIND_SERVICE_ACCOUNT:
		return "serviceaccount:" + s.GetNamespace() + ":" + s.GetName()
	}
	return s.GetName()
}

// Read decodes every manifest under paths: files, directories (recursively: every .yaml,
// .yml and .json file, in lexical order, skipping hidden directories such as .git) and "-" for
// stdin. It fails, listing every problem, when a manifest does not decode, when two manifests
// declare the same object, or when role templates inherit in a cycle.
func Read(paths []string, stdin io.Reader) ([]*Object, error) {
	var objs []*Object
	var errs []error
	add := func(name string, r io.Reader) {
		o, err := Decode(name, r)
		objs = append(objs, o...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range paths {
		if p == "-" {
			add("-", stdin)
			continue
		}
		info, err := os.Stat(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !info.IsDir() {
			if err := readFile(p, add); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path != p && strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				return nil
			}
			switch filepath.Ext(path) {
			case ".yaml", ".yml", ".json":
				return readFile(path, add)
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		errs = append(errs, checkSet(objs)...)
	}
	return objs, errors.Join(errs...)
}

func readFile(path string, add func(string, io.Reader)) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	add(path, bytes.NewReader(data))
	return nil
}

// checkSet finds what no single manifest shows: two declaring one object, and role
// templates inheriting in a cycle (which the API refuses one template at a time, halfway
// through an apply).
func checkSet(objs []*Object) []error {
	var errs []error
	seen := map[string]*Object{}
	inherits := map[string][]string{}
	for _, o := range objs {
		k := o.Key()
		if first, ok := seen[k]; ok {
			errs = append(errs, fmt.Errorf("%s: %s is declared twice (first at %s)", o.Source, k, first.Source))
			continue
		}
		seen[k] = o
		if rt, ok := o.Spec.(*rbacv1.RoleTemplate); ok {
			inherits[o.Name] = rt.Inherits
		}
	}
	// Depth-first search; a template met again while on the stack closes a cycle.
	const (
		unvisited = iota
		onStack
		done
	)
	state := map[string]int{}
	var stack []string
	var visit func(string) []string
	visit = func(n string) []string {
		state[n] = onStack
		stack = append(stack, n)
		for _, m := range inherits[n] {
			switch state[m] {
			case onStack:
				i := slices.Index(stack, m)
				return append(slices.Clone(stack[i:]), m)
			case unvisited:
				if c := visit(m); c != nil {
					return c
				}
			}
		}
		stack = stack[:len(stack)-1]
		state[n] = done
		return nil
	}
	names := make([]string, 0, len(inherits))
	for n := range inherits {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if state[n] == unvisited {
			if c := visit(n); c != nil {
				errs = append(errs, fmt.Errorf("%s: role templates inherit in a cycle: %s", seen["RoleTemplate/"+c[0]].Source, strings.Join(c, " → ")))
				break
			}
		}
	}
	return errs
}

// Clean returns a copy of spec holding only the fields a manifest of kind k sets: what
// apply compares and what export writes.
func (k *Kind) Clean(spec proto.Message) proto.Message {
	c := proto.Clone(spec)
	k.clean(c.ProtoReflect(), "")
	return c
}

func (k *Kind) clean(m protoreflect.Message, ppath string) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if !k.settable(ppath, fd) {
			m.Clear(fd)
			return true
		}
		fp := string(fd.Name())
		if ppath != "" {
			fp = ppath + "." + fp
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(_ protoreflect.MapKey, e protoreflect.Value) bool {
					k.clean(e.Message(), fp)
					return true
				})
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				for i := 0; i < v.List().Len(); i++ {
					k.clean(v.List().Get(i).Message(), fp)
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			k.clean(v.Message(), fp)
		}
		return true
	})
}

// document is a manifest as written: the top-level fields in the conventional order.
type document struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   metadata `yaml:"metadata"`
	Spec       any      `yaml:"spec,omitempty"`
}

type metadata struct {
	Name        string            `yaml:"name,omitempty"`
	Project     string            `yaml:"project,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// Encode writes objs as a stream of YAML documents that Decode reads back to the same
// objects. Specs are written as the API's JSON mapping (camelCase fields, enum names).
func Encode(w io.Writer, objs []*Object) error {
	for i, o := range objs {
		if i > 0 {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		b, err := Marshal(o)
		if err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// Marshal renders one object as a YAML document.
func Marshal(o *Object) ([]byte, error) {
	doc := document{
		APIVersion: APIVersion,
		Kind:       o.Kind.Name,
		Metadata:   metadata{Name: o.Name, Project: o.Project, Labels: o.Labels, Annotations: o.Annotations},
	}
	raw, err := protojson.Marshal(o.Kind.Clean(o.Spec))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Key(), err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("%s: %w", o.Key(), err)
	}
	if len(spec) > 0 {
		doc.Spec = spec
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	enc.CompactSeqIndent() // "- " inside the indentation, as kubectl writes lists
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("%s: %w", o.Key(), err)
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
