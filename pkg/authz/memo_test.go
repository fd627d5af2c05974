package authz

import "testing"

func TestMemoForgetsWhenItsInputsChange(t *testing.T) {
	change := make(chan struct{})
	m := memo[string, int]{deps: func() []<-chan struct{} { return []<-chan struct{}{change} }}
	calls := 0
	compute := func() int { calls++; return calls }
	first := m.get("k", compute)
	second := m.get("k", compute)
	if first != 1 || second != 1 {
		t.Fatalf("reads gave %d and %d: a second read recomputed", first, second)
	}
	close(change)
	change = make(chan struct{})
	if got := m.get("k", compute); got != 2 {
		t.Fatalf("after a change: %d, want a recomputed 2", got)
	}
	if got := m.get("k", compute); got != 2 {
		t.Fatalf("recomputed twice: %d", got)
	}
}

func TestScopeNamesWhere(t *testing.T) {
	for _, tc := range []struct {
		s    Scope
		want string
	}{
		{Scope{Kind: Project, Project: "team-a"}, `in project "team-a"`},
		{Scope{Kind: Namespace, Cluster: "c1", Namespace: "web"}, `in namespace "web" on cluster "c1"`},
		{Scope{Kind: Namespace, Namespace: "web"}, `in namespace "web" (every project owning it on any cluster)`},
		{Scope{Kind: Platform}, "fleet-wide (platform admins only)"},
	} {
		if got := tc.s.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.s, got, tc.want)
		}
	}
}
