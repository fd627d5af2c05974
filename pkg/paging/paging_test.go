package paging

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/pkg/apierr"
)

func id(s string) string { return s }

// TestPagesEndWithoutAnEmptyPage: a list that is an exact multiple of the page size ends on
// its last full page (no token leading to an empty page), and an empty list is one empty page.
func TestPagesEndWithoutAnEmptyPage(t *testing.T) {
	items := []string{"a", "b", "c", "d"}
	var v apierr.Violations
	p := Parse(&v, Request{PageSize: 2, List: "L"})
	page, next := Slice(p, items, id)
	if !slices.Equal(page, []string{"a", "b"}) || next == "" {
		t.Fatalf("first page %v, token %q", page, next)
	}
	p = Parse(&v, Request{PageSize: 2, PageToken: next, List: "L"})
	page, next = Slice(p, items, id)
	if !slices.Equal(page, []string{"c", "d"}) || next != "" {
		t.Fatalf("last page %v, token %q: want no token", page, next)
	}
	if page, next := Slice(Parse(&v, Request{List: "L"}), []string(nil), id); len(page) != 0 || next != "" {
		t.Fatalf("empty list: %v %q", page, next)
	}
	if err := v.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestTokenNamesItsListAndFilters: a token is refused by another List or other filters, and
// filters that concatenate alike still differ.
func TestTokenNamesItsListAndFilters(t *testing.T) {
	var v apierr.Violations
	_, tok := Slice(Parse(&v, Request{PageSize: 1, List: "L", Filters: []string{"ab", "c"}}), []string{"x", "y"}, id)
	for _, r := range []Request{
		{PageToken: tok, List: "M", Filters: []string{"ab", "c"}},
		{PageToken: tok, List: "L", Filters: []string{"a", "bc"}},
		{PageToken: "!" + tok, List: "L", Filters: []string{"ab", "c"}},
		{PageToken: "cDIueC55", List: "L", Filters: []string{"ab", "c"}}, // "p2.x.y": another version
	} {
		var v apierr.Violations
		Parse(&v, r)
		if err := v.Err(); err == nil || !strings.Contains(err.Error(), "page_token") {
			t.Errorf("%+v: %v, want a page_token violation", r, err)
		}
	}
	var ok apierr.Violations
	if p := Parse(&ok, Request{PageToken: tok, List: "L", Filters: []string{"ab", "c"}}); ok.Err() != nil || p.After != "x" {
		t.Fatalf("the same filters: %v, after %q", ok.Err(), p.After)
	}
}

// TestAllStopsAServerRepeatingItsToken: a server answering the token it was given would
// otherwise keep All looping.
func TestAllStopsAServerRepeatingItsToken(t *testing.T) {
	calls := 0
	err := All(func(string) (string, error) { calls++; return "same", nil })
	if err == nil || calls != 2 {
		t.Fatalf("All: %v after %d calls", err, calls)
	}
	want := errors.New("refused")
	if err := All(func(string) (string, error) { return "", want }); !errors.Is(err, want) {
		t.Fatalf("All: %v", err)
	}
}
