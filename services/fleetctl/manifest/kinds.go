// Package manifest reads and writes Fleetstream manifests: YAML documents of apiVersion
// fleetstream.io/v1alpha1 that declare what a fleet holds (clusters, projects, namespace
// bindings, role templates, ...), the way Kubernetes manifests declare a cluster's objects.
//
// A kind's spec is not a second copy of the API: it is the API's own message (clusterv1.Cluster
// for a Cluster, rbacv1.RoleTemplate for a RoleTemplate, ...) restricted to the fields a user
// declares. The decoder walks the manifest against that message's descriptor, and the JSON
// Schema of the kind (Schema) is generated from the same descriptor and the same field list, so
// a field added to the API is a field of the manifest and of its schema at once, and the two
// cannot disagree about what is valid.
package manifest

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	endpointv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/endpoint/v1"
	placementv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/placement/v1"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
)

// APIVersion is the only version manifests are written in so far.
const APIVersion = "fleetstream.io/v1alpha1"

// Kind describes one kind of manifest: which API message its spec is and which of that
// message's fields a manifest may set.
type Kind struct {
	Name string
	// Spec is the API message the spec decodes into (a prototype; never modified).
	Spec proto.Message
	// Fields are the proto names of the Spec fields a manifest sets under spec. The others are
	// computed or carried by metadata (name, labels), and are unknown fields in a manifest.
	Fields []string
	// OutputOnly are dotted proto-name paths below Fields that the API computes
	// ("taints.time_added"): unknown fields in a manifest, like the ones Fields leaves out.
	OutputOnly []string
	// Project: the object lives in a project, metadata.project is required. Otherwise it is
	// fleet-wide and metadata.project is an error.
	Project bool
	// NameOptional: the API identifies the object by its spec (a role binding is its project,
	// subject and template), so metadata.name is only a label for the reader.
	NameOptional bool
	// Labels: the API stores labels for the kind; metadata.labels is an error for the others,
	// since apply could not keep them.
	Labels bool
	// Rank orders apply: every object of a lower rank is applied before any of a higher one
	// (clusters and role templates before projects before bindings), and prune deletes in the
	// reverse order.
	Rank int
	// Description heads the kind's JSON Schema.
	Description string
}

// Kinds are the kinds manifests may declare, in apply order.
var kinds = []*Kind{
	{
		Name: "Cluster", Spec: &clusterv1.Cluster{},
		Fields:      []string{"claims", "taints"},
		OutputOnly:  []string{"taints.time_added"},
		Labels:      true,
		Rank:        0,
		Description: "A member cluster: its labels (metadata.labels), claims and taints. Registering it hands out its agent token once, which apply writes to --token-dir.",
	},
	{
		Name: "RoleTemplate", Spec: &rbacv1.RoleTemplate{},
		Fields:      []string{"display_name", "rules", "inherits", "locked"},
		Rank:        0,
		Description: "A custom role, the ClusterRole fleetstream:<name> on every member cluster.",
	},
	{
		Name: "ClusterSet", Spec: &placementv1.ClusterSet{},
		Fields:      []string{"selector"},
		Rank:        0,
		Description: "A named group of clusters (OCM's ManagedClusterSet).",
	},
	{
		Name: "Subscriber", Spec: &clusterv1.Subscriber{},
		Fields:      []string{"streams"},
		Rank:        0,
		Description: "A downstream system's NATS identity, reading the event streams it names. Creating it hands out its token once, which apply writes to --token-dir.",
	},
	{
		Name: "ImportPolicy", Spec: &clusterv1.ImportPolicy{},
		Fields:      []string{"source", "references", "name_template", "template", "creation_condition"},
		Rank:        1,
		Description: "Turns objects of another inventory, which a registered cluster's agent watches, into clusters. Credentials in its template come from references, never literal values.",
	},
	{
		Name: "Project", Spec: &projectv1.Project{},
		Fields:      []string{"display_name", "budgets"},
		OutputOnly:  []string{"budgets.allocated"},
		Labels:      true,
		Rank:        1,
		Description: "A tenancy unit: a set of namespaces across clusters, with per-cluster budgets.",
	},
	{
		Name: "ClusterSetBinding", Spec: &placementv1.ClusterSetBinding{},
		Fields:       []string{"cluster_set"},
		Project:      true,
		NameOptional: true,
		Rank:         2,
		Description:  "Lets a project place namespaces on the clusters of a cluster set.",
	},
	{
		Name: "Placement", Spec: &placementv1.Placement{},
		Fields:      []string{"cluster_sets", "number_of_clusters", "predicates", "tolerations", "prioritizer_policy", "decision_strategy"},
		Project:     true,
		Rank:        3,
		Description: "Picks clusters for a project from its bound cluster sets, as an OCM Placement does (the same fields, with the API's enum names); namespaces can follow it.",
	},
	{
		Name: "NamespaceBinding", Spec: &projectv1.NamespaceBinding{},
		// Not unbind_policy: the API lists a followed namespace only through its bindings,
		// which do not carry its policy, so apply could neither compare nor export it.
		Fields:      []string{"cluster", "placement", "hard"},
		Project:     true,
		Rank:        4,
		Description: "Gives the namespace metadata.name of one cluster (spec.cluster), or of every cluster a placement decides (spec.placement), to a project, with optional hard limits.",
	},
	{
		Name: "ProjectRoleBinding", Spec: &rbacv1.ProjectRoleBinding{},
		Fields:       []string{"subject", "role_template"},
		Project:      true,
		NameOptional: true,
		Rank:         4,
		Description:  "Grants a subject a role template in every namespace of a project, on every cluster.",
	},
	{
		Name: "ServiceWeights", Spec: &endpointv1.ServiceWeights{},
		Fields:     []string{"namespace", "cluster_weights", "endpoint_weights"},
		OutputOnly: []string{"endpoint_weights.cluster_id", "endpoint_weights.target_uid", "endpoint_weights.set_time"},
		// After the namespace bindings: a project's members may weight a service only where
		// their project owns its namespace.
		Rank:        5,
		Description: "The traffic weights of the service metadata.name in spec.namespace: per cluster (0 drains, 100 is the default) and per endpoint IP in a cluster, which binds to the endpoint serving that IP now. Weights left out are the default.",
	},
}

// Kinds returns every kind, in apply order.
func Kinds() []*Kind { return slices.Clone(kinds) }

// KindNamed returns the kind called name (case-sensitive, as in Kubernetes), or nil.
func KindNamed(name string) *Kind {
	for _, k := range kinds {
		if k.Name == name {
			return k
		}
	}
	return nil
}

func kindNames() string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.Name
	}
	return strings.Join(names, ", ")
}

// field returns the spec field called name in the manifest (its JSON name or its proto name)
// at proto-name path parent (empty at the spec's top), or nil when a manifest may not set it.
func (k *Kind) field(md protoreflect.MessageDescriptor, parent, name string) protoreflect.FieldDescriptor {
	fd := md.Fields().ByJSONName(name)
	if fd == nil {
		fd = md.Fields().ByName(protoreflect.Name(name))
	}
	if fd == nil {
		return nil
	}
	if !k.settable(parent, fd) {
		return nil
	}
	return fd
}

// settable reports whether a manifest may set fd, a field of the message at proto-name path
// parent.
func (k *Kind) settable(parent string, fd protoreflect.FieldDescriptor) bool {
	p := string(fd.Name())
	if parent == "" {
		return slices.Contains(k.Fields, p)
	}
	return !slices.Contains(k.OutputOnly, parent+"."+p)
}

// Object is one decoded manifest.
type Object struct {
	Kind        *Kind
	Name        string
	Project     string
	Labels      map[string]string
	Annotations map[string]string
	// Spec is a message of Kind.Spec's type holding only the fields the manifest set.
	Spec proto.Message
	// Source says where the manifest was read, for messages about it.
	Source Source
}

// Source is where a manifest was read: a file (or "-" for standard input), the 1-based index of
// the document in it and the line the document starts on.
type Source struct {
	File string
	Doc  int
	Line int
}

func (s Source) String() string {
	if s.File == "" {
		return "(generated)"
	}
	return fmt.Sprintf("%s:%d: document %d", s.File, s.Line, s.Doc)
}
