package clusterimport_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
	"github.com/fleetstream/fleetstream/pkg/testkit"
	"github.com/fleetstream/fleetstream/services/cluster-import/clusterimport"
)

// TestListClustersPages: paging through the clusters a selector matches sees each cluster
// there throughout exactly once, in name order, while clusters are registered and
// deregistered between pages; a bad token or size is InvalidArgument naming the field.
func TestListClustersPages(t *testing.T) {
	e := start(t, nil, clusterimport.Config{})
	ctx := testkit.Context(t, 30*time.Second)
	var prod []string
	for i := range 22 {
		env := "dev"
		if i%2 == 0 {
			env = "prod"
			prod = append(prod, fmt.Sprintf("c%02d", i))
		}
		register(t, e, fmt.Sprintf("c%02d", i), map[string]string{"env": env})
	}
	register(t, e, "c99", map[string]string{"env": "prod"}) // deregistered while paging

	req := &clusterv1.ListClustersRequest{LabelSelector: "env=prod", PageSize: 4}
	var names []string
	var sizes []int
	var firstToken string
	for page := 0; ; page++ {
		res, err := e.client.ListClusters(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		for _, c := range res.Msg.Clusters {
			names = append(names, c.Name)
		}
		sizes = append(sizes, len(res.Msg.Clusters))
		if res.Msg.NextPageToken == "" {
			break
		}
		if page > 50 {
			t.Fatal("paging does not end")
		}
		req.PageToken = res.Msg.NextPageToken
		if page == 0 {
			firstToken = req.PageToken
			register(t, e, "a-behind", map[string]string{"env": "prod"})
			register(t, e, "z-ahead", map[string]string{"env": "prod"})
			if _, err := e.client.DeregisterCluster(ctx, connect.NewRequest(&clusterv1.DeregisterClusterRequest{Name: "c99"})); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := append(slices.Clone(prod), "z-ahead")
	if !slices.Equal(names, want) {
		t.Fatalf("paged through\n%v\nwant each once, in order:\n%v", names, want)
	}
	if !slices.Equal(sizes, []int{4, 4, 4}) {
		t.Fatalf("pages hold %v clusters, want [4 4 4]", sizes)
	}

	for _, tc := range []struct {
		name  string
		req   *clusterv1.ListClustersRequest
		field string
	}{
		{"not a token", &clusterv1.ListClustersRequest{PageToken: "!!"}, "page_token"},
		{"another selector's", &clusterv1.ListClustersRequest{LabelSelector: "env=dev", PageToken: firstToken}, "page_token"},
		{"negative size", &clusterv1.ListClustersRequest{PageSize: -1}, "page_size"},
		{"too large a size", &clusterv1.ListClustersRequest{PageSize: 1001}, "page_size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.ListClusters(ctx, connect.NewRequest(tc.req))
			if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
}
