package collector

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// A part holds its first slice by value and the rest, with a merge of its own, behind x only
// when it is not the usual one-slice identity merge (part). Its slices and merge must read the
// same whatever the shape it goes through, and a part's copy must not change when the copy it
// was made from is given new slices (the snapshot before still reads it).
func TestPartShapes(t *testing.T) {
	st := NewStore()
	one := st.ports.share([]port{{num: 8080}})
	two := st.ports.share([]port{{num: 80}, {num: 9090}})
	mk := func(name string, ports *[]port, last ...byte) slice {
		var eps []endpoint
		for _, b := range last {
			e := endpoint{flags: fV4 | fReady}
			e.addr[10], e.addr[11], e.addr[15] = 0xff, 0xff, b
			eps = append(eps, e)
		}
		buf, _ := encodeSlice(name, "svc", eps, nil)
		return slice{buf: buf, ports: ports}
	}
	show := func(p *part) string {
		var out []string
		for _, r := range p.refs() {
			s := p.slice(int(r.s))
			out = append(out, fmt.Sprintf("%s:%d:%d", s.name(), s.ep(int(r.e)).addr[15], (*s.ports)[r.p].num))
		}
		return fmt.Sprintf("%d %s", p.nslices(), strings.Join(out, " "))
	}
	p := newPart((&clusterInfo{name: "east"}).bare())
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
		if p.usual() == step.withMore || p.ref().info.name != "east" || (p.nslices() > 0 && p.x.ports != step.slices[0].ports) {
			t.Fatalf("step %d: usual %v, x %+v", i, p.usual(), *p.x)
		}
		if got := fmt.Sprint(p.slices()); p.nslices() != len(p.slices()) || (p.nslices() > 0 && !strings.Contains(got, p.first)) {
			t.Fatalf("step %d: slices() %s", i, got)
		}
		if i > 0 && show(&before) != wantBefore {
			t.Fatalf("step %d: the part before changed: %s, was %s", i, show(&before), wantBefore)
		}
		before, wantBefore = p, step.want
	}
}

// A cluster's refs are interned: one per (id, stale), so a snapshot's cluster is one pointer;
// and a ref's record for usual parts, one per port list.
func TestClusterRefsInterned(t *testing.T) {
	c := &clusterInfo{name: "east"}
	a, b := c.ref("id-1", false), c.ref("id-1", true)
	if a == b || c.ref("id-1", false) != a || c.ref("id-1", true) != b || c.bare() != c.ref("", false) {
		t.Fatal("refs not interned by (id, stale)")
	}
	if a.info != c || a.id != "id-1" || a.stale || !b.stale || len(c.refs) != 3 {
		t.Fatalf("refs %q/%v and %q/%v, %d held", a.id, a.stale, b.id, b.stale, len(c.refs))
	}
	one, two := &[]port{{num: 80}}, &[]port{{num: 81}}
	if x := a.usualFor(one); x != a.usualFor(one) || x == a.usualFor(two) || x == b.usualFor(one) ||
		x.cluster != a || x.ports != one || x.merged != nil || x.rest != nil {
		t.Fatal("usual parts' records not interned by (ref, ports)")
	}
}

// A slice's string holds its endpoints, name and targets; what is read back must be what went
// in, for IPv4 slices (4-byte addresses), IPv6 and mixed ones (16), with and without targets,
// and the bounds must refuse what the header cannot say.
func TestSliceEncoding(t *testing.T) {
	v4 := func(last byte, target string) endpoint {
		e := endpoint{flags: fV4 | fReady | fHasUID, zone: 7, node: 1 << 20, tLen: uint16(len(target))}
		e.addr[10], e.addr[11], e.addr[12], e.addr[15] = 0xff, 0xff, 10, last
		e.uid[0], e.uid[15] = last, 0xAB
		return e
	}
	v6 := func(last byte, target string) endpoint {
		e := endpoint{flags: fServing | fTerminating, zone: 3, node: 4, tLen: uint16(len(target))}
		e.addr[0], e.addr[1], e.addr[15] = 0xfd, 0x00, last
		return e
	}
	cases := []struct {
		name    string
		svc     string
		mk      []func(byte, string) endpoint
		targets []string
		width   int
	}{
		{"none", "", nil, nil, recV4},
		{"svc-abcde", "svc", []func(byte, string) endpoint{v4}, []string{"Pod/p-1"}, recV4}, // the service begins the name
		{"svc", "svc", []func(byte, string) endpoint{v4}, []string{"Pod/p-1"}, recV4},       // the name is the service's
		{"svcx-1", "svc", []func(byte, string) endpoint{v4}, []string{"Pod/p-1"}, recV4},    // a prefix, not followed by a dash
		{"v4-many", "cart", []func(byte, string) endpoint{v4, v4, v4}, []string{"Pod/a", "", "Pod/ccc"}, recV4},
		{"v6", "web", []func(byte, string) endpoint{v6, v6}, []string{"", "Pod/x"}, recV6},
		{"mixed", "m", []func(byte, string) endpoint{v4, v6}, []string{"Pod/four", "Pod/six"}, recV6},
		{strings.Repeat("n", 253), strings.Repeat("s", 63), []func(byte, string) endpoint{v4}, []string{strings.Repeat("t", 300)}, recV4},
	}
	for _, tc := range cases {
		var eps []endpoint
		var arena []byte
		for i, mk := range tc.mk {
			e := mk(byte(i+1), tc.targets[i])
			e.tOff = uint32(len(arena))
			arena = append(arena, tc.targets[i]...)
			eps = append(eps, e)
		}
		// The arena in another order than the endpoints: encoding follows the endpoints.
		slices.Reverse(eps)
		buf, ok := encodeSlice(tc.name, tc.svc, eps, arena)
		if !ok {
			t.Fatalf("%.10s: refused", tc.name)
		}
		s := &slice{buf: buf, ports: noPorts}
		if s.name() != tc.name || s.service() != tc.svc || s.n() != len(eps) || s.width() != tc.width {
			t.Fatalf("%.10s: name %.10q service %.10q, %d endpoints of %d bytes", tc.name, s.name(), s.service(), s.n(), s.width())
		}
		starts := s.targetStarts(nil)
		var all string
		for i := range eps {
			want := eps[i]
			want.tOff = 0
			if got := s.ep(i); got != want {
				t.Fatalf("%.10s: endpoint %d: %+v, want %+v", tc.name, i, got, want)
			}
			if a, f := s.addr(i); a != want.addr || f != want.flags || s.flags(i) != want.flags {
				t.Fatalf("%.10s: endpoint %d: address %v flags %x", tc.name, i, a, f)
			}
			target := string(arena[eps[i].tOff : eps[i].tOff+uint32(eps[i].tLen)])
			if got := s.target(i, starts[i]); got != target {
				t.Fatalf("%.10s: endpoint %d: target %q, want %q", tc.name, i, got, target)
			}
			all += target
		}
		if s.targets() != all {
			t.Fatalf("%.10s: targets %q, want %q", tc.name, s.targets(), all)
		}
		// Naming keeps everything else, whichever way the service's name is held.
		before := s.String()
		for _, svc := range []string{"renamed", "other", "re"} {
			if !s.setName("renamed", svc) || s.name() != "renamed" || s.service() != svc || s.n() != len(eps) ||
				strings.Replace(before, tc.name, "renamed", 1) != s.String() || s.targets() != all {
				t.Fatalf("%.10s: renamed: %s (service %q), was %s", tc.name, s.String(), s.service(), before)
			}
		}
	}
	if _, ok := encodeSlice(strings.Repeat("n", maxName+1), "s", nil, nil); ok {
		t.Fatal("a name longer than the header can say was encoded")
	}
	if _, ok := encodeSlice("s", strings.Repeat("s", maxSvc+1), nil, nil); ok {
		t.Fatal("a service name longer than the header can say was encoded")
	}
	if _, ok := encodeSlice("s", "s", make([]endpoint, maxSliceEndpoints+1), nil); ok {
		t.Fatal("more endpoints than the header can say were encoded")
	}
	s := &slice{buf: namedBuf("a", "a")}
	if s.setName(strings.Repeat("n", maxName+1), "a") || s.setName("a", strings.Repeat("s", maxSvc+1)) {
		t.Fatal("setName took a name longer than the header can say")
	}
}

// A part's cluster changes (a new id, stale, evicted) by pointing at another clusterRef: a usual
// part at that ref's shared record, another part at a copy of its own, and never in place, since
// the snapshot before still reads the part it was copied from.
func TestPartSetRef(t *testing.T) {
	c := &clusterInfo{name: "east"}
	live, stale := c.ref("id", false), c.ref("id", true)
	one := slice{buf: namedBuf("a", "svc"), ports: noPorts}
	two := []slice{one, {buf: namedBuf("b", "svc"), ports: noPorts}}
	for _, ss := range [][]slice{{one}, two} {
		before := newPart(live)
		before.setSlices(ss)
		after := before
		after.setRef(stale)
		if before.ref() != live || after.ref() != stale || after.nslices() != len(ss) || before.usual() != after.usual() {
			t.Fatalf("%d slices: before %p usual %v, after %p usual %v", len(ss), before.ref(), before.usual(), after.ref(), after.usual())
		}
		if before.usual() && (after.x != stale.usualFor(noPorts) || before.x != live.usualFor(noPorts)) {
			t.Fatalf("a usual part does not share its cluster's record")
		}
		x := after.x
		if after.setRef(stale); after.x != x {
			t.Fatalf("setting the same cluster again made a new record")
		}
	}
}

// BenchmarkMergeSlices: a part's merge of 5 slices x 10 endpoints on one port (as
// BenchmarkSliceUpdates' services have in each cluster), one copy of each address moving
// between two of them.
//
//	go test -run '^$' -bench MergeSlices ./collector/
func BenchmarkMergeSlices(b *testing.B) {
	st := NewStore()
	ports := st.ports.share([]port{{num: 8080}})
	var ss []slice
	for k := range 5 {
		var eps []endpoint
		for i := range 10 {
			e := endpoint{flags: fV4 | fReady | fServing}
			e.addr[10], e.addr[11], e.addr[14], e.addr[15] = 0xff, 0xff, byte(k), byte(i)
			if k == 1 && i == 0 {
				e.addr[14], e.flags = 0, fV4 // a not-ready copy of 0.0 in slice 1
			}
			eps = append(eps, e)
		}
		s, _ := newSlice(eps, nil, ports, fmt.Sprintf("svc-%d", k), "svc")
		ss = append(ss, *s)
	}
	p := newPart((&clusterInfo{name: "east"}).bare())
	b.ReportAllocs()
	for b.Loop() {
		p.setSlices(ss)
	}
	if n := len(p.refs()); n != 49 {
		b.Fatalf("%d merged", n)
	}
}

// A part's targets read in merge order are each endpoint's own, whichever way the merge walks
// the slices: in order (the usual part; a slice's ports one after the other) or across them.
func TestTargetIndex(t *testing.T) {
	st := NewStore()
	mk := func(name string, ports *[]port, lasts ...byte) slice {
		var eps []endpoint
		var arena []byte
		for _, b := range lasts {
			e := endpoint{flags: fV4 | fReady}
			e.addr[10], e.addr[11], e.addr[15] = 0xff, 0xff, b
			target := fmt.Sprintf("Pod/%s-%s", name, strings.Repeat("x", int(b)))
			e.tOff, e.tLen = uint32(len(arena)), uint16(len(target))
			arena = append(arena, target...)
			eps = append(eps, e)
		}
		s, _ := newSlice(eps, arena, ports, name, "svc")
		return *s
	}
	one := st.ports.share([]port{{num: 80}})
	two := st.ports.share([]port{{num: 80}, {num: 81}})
	for _, ss := range [][]slice{
		{mk("a", one, 1, 2, 3)},                     // the usual part
		{mk("a", two, 1, 2, 3)},                     // two ports
		{mk("a", one, 1, 4, 6), mk("b", one, 2, 5)}, // the merge goes back and forth
		{mk("a", two, 5, 9), mk("b", one, 1, 5, 7)}, // and a copy in both
	} {
		p := newPart((&clusterInfo{name: "east"}).bare())
		p.setSlices(ss)
		idx := targetStarts(&p)
		for _, r := range p.refs() {
			s := p.slice(int(r.s))
			e := s.ep(int(r.e))
			want := fmt.Sprintf("Pod/%s-%s", s.name(), strings.Repeat("x", int(e.addr[15])))
			if got := s.target(int(r.e), idx.of(int(r.s), int(r.e))); got != want {
				t.Fatalf("%d slices: endpoint %d of %s: target %q, want %q", len(ss), r.e, s.name(), got, want)
			}
		}
	}
}
