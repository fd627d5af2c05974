// Package mcs holds what both ends of Fleetstream's multi-cluster Services (KEP-1645,
// docs/kubernetes.md) must agree on: the agent that reports ServiceExports and applies
// ServiceImports, and endpoint-collector, which computes the imports.
package mcs

// The agent's bounds of one namespace's ServiceExport report; the hub refuses a report past
// them (an agent that does not bound is not trusted to).
const (
	// MaxExportsPerReport is the most exports one namespace's report carries: the oldest, as
	// KEP-1645 ranks them; the rest are counted as omitted.
	MaxExportsPerReport = 1000
	// MaxReportBytes is the most bytes one report encodes to, a quarter of NATS's default
	// max_payload, leaving room for the event envelope.
	MaxReportBytes = 256 << 10
	// MaxPortsPerExport is the most ports an exported Service may have in a report.
	MaxPortsPerExport = 100
)

// Service types of a ServiceImport (multicluster.x-k8s.io/v1alpha1).
const (
	TypeClusterSetIP = "ClusterSetIP"
	TypeHeadless     = "Headless"
)

// ProjectLabel is namespace-binding's label on a namespace an agent bound: the project that
// owns it on that cluster. An agent reports exports only from such namespaces and applies an
// import only into a namespace labelled with the import's project.
const ProjectLabel = "fleetstream.io/project"

// ConflictAnnotation is set by the hub on the ServiceImport it sends to a cluster whose own
// ServiceExport of that name is in conflict (KEP-1645: the oldest export wins); its value is
// "<reason>: <message>", the reason a ServiceExport condition reason (PortConflict,
// TypeConflict). The exporting cluster's agent writes it as the export's Conflict condition:
// the verdict travels with the import every bound cluster receives anyway, so it needs no
// bucket, key or permission of its own.
const ConflictAnnotation = "mcs.fleetstream.io/conflict"

// Condition reasons of the Conflict condition the agent writes on a ServiceExport.
const (
	ReasonNoConflicts  = "NoConflicts"
	ReasonPortConflict = "PortConflict"
	ReasonTypeConflict = "TypeConflict"
)

// The objects of bucket desired-mcs: the hub writes only these, and the agent applies only
// these, whatever a manifest says (a compromised hub-side writer must not reach RBAC or quotas
// through the MCS bucket). Kind tokens of desired keys are group-qualified, so that the agent
// maps them without a table.
const (
	ImportKind = "ServiceImport.multicluster.x-k8s.io"
	SliceKind  = "EndpointSlice.discovery.k8s.io"
)

// SliceManagedByLabel and SliceManager mark an imported EndpointSlice as the hub's (and keep
// Kubernetes' EndpointSlice controller away from it); the agent applies no EndpointSlice of
// desired-mcs without them.
const (
	SliceManagedByLabel = "endpointslice.kubernetes.io/managed-by"
	SliceManager        = "mcs.fleetstream.io"
)

// LocalServiceLabel is the label by which kube-proxy and DNS give an EndpointSlice's
// endpoints to a local Service: an imported slice must never carry it, or the hub could route
// any local Service (kube-dns) to foreign endpoints.
const LocalServiceLabel = "kubernetes.io/service-name"
