package collector

import (
	"fmt"
	"strings"
	"testing"
)

// A part holds its first slice by value and the rest, with a merge of its own, behind more only
// when it is not the usual one-slice identity merge (part). Its slices and merge must read the
// same whatever the shape it goes through, and a part's copy must not change when the copy it
// was made from is given new slices (the snapshot before still reads it).
func TestPartShapes(t *testing.T) {
	st := NewStore()
	one := st.ports.share([]port{{num: 8080}})
	two := st.ports.share([]port{{num: 80}, {num: 9090}})
	mk := func(name string, ports *[]port, last ...byte) slice {
		buf, _ := sliceBuf(name, "")
		s := slice{buf: buf, ports: ports}
		for _, b := range last {
			e := endpoint{flags: fV4 | fReady}
			e.addr[15] = b
			s.eps = append(s.eps, e)
		}
		return s
	}
	show := func(p *part) string {
		var out []string
		for _, r := range p.refs() {
			s := p.slice(int(r.s))
			out = append(out, fmt.Sprintf("%s:%d:%d", s.name(), s.eps[r.e].addr[15], (*s.ports)[r.p].num))
		}
		return fmt.Sprintf("%d %s", p.nslices(), strings.Join(out, " "))
	}
	var p part
	steps := []struct {
		slices   []slice
		want     string
		withMore bool
	}{
		{[]slice{mk("a", one, 1, 2)}, "1 a:1:8080 a:2:8080", false},
		{[]slice{mk("a", one, 1, 2), mk("b", one, 2, 3)}, "2 a:1:8080 a:2:8080 b:3:8080", true},
		{[]slice{mk("b", two, 3)}, "1 b:3:80 b:3:9090", true},
		{[]slice{mk("b", one, 4, 4)}, "1 b:4:8080", true}, // one address twice: not the identity
		{[]slice{mk("c", one, 5)}, "1 c:5:8080", false},
		{nil, "0 ", false},
	}
	var before part
	wantBefore := ""
	for i, step := range steps {
		p.setSlices(step.slices)
		if got := show(&p); got != step.want {
			t.Fatalf("step %d: %s, want %s", i, got, step.want)
		}
		if (p.more != nil) != step.withMore {
			t.Fatalf("step %d: more %v", i, p.more)
		}
		if got := fmt.Sprint(p.slices()); p.nslices() != len(p.slices()) || (p.nslices() > 0 && !strings.Contains(got, p.first.buf)) {
			t.Fatalf("step %d: slices() %s", i, got)
		}
		if i > 0 && show(&before) != wantBefore {
			t.Fatalf("step %d: the part before changed: %s, was %s", i, show(&before), wantBefore)
		}
		before, wantBefore = p, step.want
	}
}

// A cluster's refs are interned: one per (id, stale), so a snapshot's cluster is one pointer.
func TestClusterRefsInterned(t *testing.T) {
	c := &clusterInfo{name: "east"}
	a, b := c.ref("id-1", false), c.ref("id-1", true)
	if a == b || c.ref("id-1", false) != a || c.ref("id-1", true) != b || c.bare() != c.ref("", false) {
		t.Fatal("refs not interned by (id, stale)")
	}
	if a.info != c || a.id != "id-1" || a.stale || !b.stale || len(c.refs) != 3 {
		t.Fatalf("refs %+v %+v, %d held", *a, *b, len(c.refs))
	}
}
