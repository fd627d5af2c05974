package collector

import (
	"slices"
	"testing"
)

// The sweep for deregistrations the registry view cannot show looks only at the clusters the
// registry has not shown: none in a fleet whose clusters are all registered, whatever its size.
func TestUnregisteredListsOnlyClustersTheRegistryHasNotShown(t *testing.T) {
	st := NewStore()
	names := func() []string {
		var out []string
		for _, c := range st.Unregistered() {
			out = append(out, c.name)
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		name string
		do   func()
		want []string
	}{
		{"clusters heard of from their agents only", func() { st.cluster("a"); st.cluster("b"); st.cluster("c") }, []string{"a", "b", "c"}},
		{"one shown by the registry", func() { st.registered(st.cluster("a")) }, []string{"b", "c"}},
		{"shown twice", func() { st.registered(st.cluster("a")) }, []string{"b", "c"}},
		{"one known deregistered", func() { st.cluster("b").deregistered.Store(true) }, []string{"c"}},
		{"a new one registered before its agent reported", func() { st.registered(st.cluster("d")) }, []string{"c"}},
		{"all registered", func() { st.registered(st.cluster("b")); st.registered(st.cluster("c")) }, nil},
	} {
		tc.do()
		if got := names(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: unregistered %v, want %v", tc.name, got, tc.want)
		}
	}
}
