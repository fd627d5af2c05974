// Package crds holds the CustomResourceDefinitions the kube bridge installs on the hub, each the
// upstream project's file verbatim:
//
//   - multicluster.x-k8s.io_clusterprofiles.yaml: kubernetes-sigs/cluster-inventory-api
//     config/crd/bases at tag v0.1.2 (commit 2b5fcd138906cd0ea0c1dcac5aae14f1876b23a4);
//   - 0000_03_clusters.open-cluster-management.io_placementdecisions.crd.yaml:
//     open-cluster-management.io/api v1.1.0, cluster/v1beta1 (the module the bridge's
//     PlacementDecision types come from).
//
// services/fleetd's TestKubeBridgePublishes* apply what the bridge writes against these schemas
// on a real kube-apiserver.
package crds

import _ "embed"

// ClusterProfiles is the CRD of multicluster.x-k8s.io/v1alpha1 ClusterProfile.
//
//go:embed multicluster.x-k8s.io_clusterprofiles.yaml
var ClusterProfiles []byte

// PlacementDecisions is the CRD of cluster.open-cluster-management.io/v1beta1 PlacementDecision.
//
//go:embed 0000_03_clusters.open-cluster-management.io_placementdecisions.crd.yaml
var PlacementDecisions []byte

// All lists every CRD the bridge installs.
func All() [][]byte { return [][]byte{ClusterProfiles, PlacementDecisions} }
