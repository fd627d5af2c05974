package cli

import (
	"context"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1/clusterv1connect"
	projectv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/project/v1/projectv1connect"
	rbacv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1"
	"github.com/fleetstream/fleetstream/pkg/gen/fleetstream/rbac/v1/rbacv1connect"
	"github.com/fleetstream/fleetstream/pkg/paging"
)

// The list commands and export print or write every object, so they follow next_page_token to
// the last page: the server pages these lists (500 a page unless asked otherwise) and a
// command showing only the first page would drop the rest without a word.

func allNamespaceBindings(ctx context.Context, f *factory, req *projectv1.ListNamespaceBindingsRequest) ([]*projectv1.NamespaceBinding, error) {
	var out []*projectv1.NamespaceBinding
	err := paging.All(func(token string) (string, error) {
		req.PageToken = token
		res, err := call(ctx, f, projectv1connect.NewProjectServiceClient, projectv1connect.ProjectServiceClient.ListNamespaceBindings,
			req, "list namespace bindings")
		if err != nil {
			return "", err
		}
		out = append(out, res.Bindings...)
		return res.NextPageToken, nil
	})
	return out, err
}

func allProjectRoleBindings(ctx context.Context, f *factory, req *rbacv1.ListProjectRoleBindingsRequest) ([]*rbacv1.ProjectRoleBinding, error) {
	var out []*rbacv1.ProjectRoleBinding
	err := paging.All(func(token string) (string, error) {
		req.PageToken = token
		res, err := call(ctx, f, rbacv1connect.NewRBACServiceClient, rbacv1connect.RBACServiceClient.ListProjectRoleBindings,
			req, "list project role bindings")
		if err != nil {
			return "", err
		}
		out = append(out, res.Bindings...)
		return res.NextPageToken, nil
	})
	return out, err
}

func allClusters(ctx context.Context, f *factory, req *clusterv1.ListClustersRequest) ([]*clusterv1.Cluster, error) {
	var out []*clusterv1.Cluster
	err := paging.All(func(token string) (string, error) {
		req.PageToken = token
		res, err := call(ctx, f, clusterv1connect.NewClusterServiceClient, clusterv1connect.ClusterServiceClient.ListClusters,
			req, "list clusters")
		if err != nil {
			return "", err
		}
		out = append(out, res.Clusters...)
		return res.NextPageToken, nil
	})
	return out, err
}
