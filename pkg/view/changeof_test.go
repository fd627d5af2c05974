package view

import (
	"testing"

	"google.golang.org/protobuf/proto"

	clusterv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/cluster/v1"
)

func TestChangeOfIsTypedAndDeletesOnNil(t *testing.T) {
	rename := ChangeOf("k", func(c *clusterv1.Cluster) *clusterv1.Cluster {
		if c == nil {
			return &clusterv1.Cluster{Name: "new"}
		}
		c.Name += "+"
		return c
	})
	drop := ChangeOf("k", func(*clusterv1.Cluster) *clusterv1.Cluster { return nil })
	cases := []struct {
		name   string
		change Change
		cur    proto.Message
		want   string // "" for deleted
	}{
		{"absent entry is nil of the type", rename, nil, "new"},
		{"present entry is passed typed", rename, &clusterv1.Cluster{Name: "a"}, "a+"},
		{"a nil pointer deletes", drop, &clusterv1.Cluster{Name: "a"}, ""},
		{"a nil pointer deletes an absent entry", drop, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.change.Key != "k" {
				t.Fatalf("key %q", tc.change.Key)
			}
			got := tc.change.Update(tc.cur)
			if tc.want == "" {
				if got != nil {
					t.Fatalf("got %v, want the entry deleted (nil interface)", got)
				}
				return
			}
			if c, ok := got.(*clusterv1.Cluster); !ok || c.Name != tc.want {
				t.Fatalf("got %v, want cluster %q", got, tc.want)
			}
		})
	}
}
