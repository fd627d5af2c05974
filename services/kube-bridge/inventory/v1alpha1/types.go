// Package v1alpha1 holds the part of the SIG-Multicluster cluster inventory API
// (multicluster.x-k8s.io/v1alpha1, KEP-4322) that the kube bridge writes: ClusterProfile, with
// upstream's field names and JSON tags.
//
// Copied, not imported: the module sigs.k8s.io/cluster-inventory-api is served by the Go proxy
// only as its tags v0.1.0–v0.1.2, which require k8s.io/{api,apimachinery,client-go} v0.35.3 and
// controller-runtime v0.23.3 (the workspace's minimal version selection would lift every
// module of the repository to Kubernetes 0.35); pseudo-versions of earlier commits, which
// require 0.33, are refused (403). The fields below are those of
// kubernetes-sigs/cluster-inventory-api apis/v1alpha1/clusterprofile_types.go at tag v0.1.2
// (commit 2b5fcd138906cd0ea0c1dcac5aae14f1876b23a4, unchanged at main 8375ac2), except
// status.credentialProviders and status.accessProviders, which the bridge does not publish
// (Fleetstream never hands out cluster credentials). The CRD (crds/) is upstream's file of the
// same tag, verbatim. Replace this package with the module once it supports the repository's
// Kubernetes version.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version of the cluster inventory API.
const (
	Group   = "multicluster.x-k8s.io"
	Version = "v1alpha1"
	Kind    = "ClusterProfile"
)

// GroupVersionResource addresses ClusterProfiles.
var GroupVersionResource = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "clusterprofiles"}

// ClusterProfileSpec defines the desired state of ClusterProfile.
type ClusterProfileSpec struct {
	// DisplayName defines a human-readable name of the ClusterProfile
	DisplayName string `json:"displayName,omitempty"`
	// ClusterManager defines which cluster manager owns this ClusterProfile resource
	ClusterManager ClusterManager `json:"clusterManager"`
}

// ClusterManager defines which cluster manager owns this ClusterProfile resource (immutable).
type ClusterManager struct {
	// Name defines the name of the cluster manager
	Name string `json:"name"`
}

// ClusterProfileStatus defines the observed state of ClusterProfile.
type ClusterProfileStatus struct {
	// Conditions contains the different condition statuses for this cluster.
	Conditions []metav1.Condition `json:"conditions"`
	// Version defines the version information of the cluster.
	Version ClusterVersion `json:"version,omitempty"`
	// Properties defines cluster characteristics through a list of Property objects.
	Properties []Property `json:"properties,omitempty"`
}

// ClusterVersion represents version information about the cluster.
type ClusterVersion struct {
	// Kubernetes is the kubernetes version of the cluster.
	Kubernetes string `json:"kubernetes,omitempty"`
}

// Property is a name/value pair of a cluster, with when it was last observed on the cluster.
type Property struct {
	// Name: 1 to 253 characters (the CRD's bounds).
	Name string `json:"name"`
	// Value: 1 to 1024 characters (the CRD's bounds).
	Value string `json:"value"`
	// LastObservedTime is when the property was observed on the cluster.
	LastObservedTime metav1.Time `json:"lastObservedTime,omitempty"`
}

// Bounds of Property as the CRD's schema states them (maxLength counts characters).
const (
	MaxPropertyName  = 253
	MaxPropertyValue = 1024
)

// ClusterConditionControlPlaneHealthy means the controlplane of the cluster is in a healthy
// state. If the control plane is not healthy, then the status condition will be "False".
const ClusterConditionControlPlaneHealthy = "ControlPlaneHealthy"

const (
	// LabelClusterManagerKey is used to indicate the name of the cluster manager that a
	// ClusterProfile belongs to. The value of the label MUST be the same as the name of the
	// cluster manager.
	LabelClusterManagerKey = "x-k8s.io/cluster-manager"
	// LabelClusterSetKey is used on a namespace to indicate the clusterset that a
	// ClusterProfile belongs to.
	LabelClusterSetKey = "multicluster.x-k8s.io/clusterset"
)

// ClusterProfile represents a single cluster in a multi-cluster deployment.
type ClusterProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterProfileSpec   `json:"spec"`
	Status ClusterProfileStatus `json:"status,omitempty"`
}
