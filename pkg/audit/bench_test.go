package audit_test

import (
	"testing"

	auditv1 "github.com/fleetstream/fleetstream/pkg/gen/fleetstream/audit/v1"
)

// BenchmarkListActivity lists from an index of 20,000 rows: the first page of everything, and
// the 20 rows of one rare actor, which the subject filter finds without the client reading the
// other 19,980 (a scan would read them all).
func BenchmarkListActivity(b *testing.B) {
	tr := startTrail(b, nil)
	const n = 20_000
	tr.appendProjects(b, "alice", n-20)
	tr.appendProjects(b, "rare", 20)
	tr.waitRows(b, &auditv1.ListActivityRequest{Actor: "rare"}, 20)
	for _, bc := range []struct {
		name string
		req  *auditv1.ListActivityRequest
		want int
	}{
		{"first-page-of-all", &auditv1.ListActivityRequest{PageSize: 100}, 100},
		{"rare-actor", &auditv1.ListActivityRequest{Actor: "rare", PageSize: 100}, 20},
		{"one-project-page", &auditv1.ListActivityRequest{Project: "p3", PageSize: 1000}, 1000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if got := len(tr.list(b, bc.req).Activities); got != bc.want {
					b.Fatalf("%d rows, want %d", got, bc.want)
				}
			}
		})
	}
}
