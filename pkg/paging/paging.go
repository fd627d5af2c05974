// Package paging pages a List RPC's answer the AIP-158 way (page_size, page_token,
// next_page_token) over a view whose entries are kept by key.
//
// A token names the last key a page returned and a fingerprint of the call's filters; the next
// page starts after that key in key order. Keys, not offsets: an object made or removed between
// two calls neither repeats an object nor skips one that was there all along (an offset would
// shift under a write). The fingerprint makes a token from another list or other filters an
// error rather than a silent jump to some other position. A token is not a capability: a caller
// who forges one only chooses where its page starts, and what it may read is filtered before
// paging, so a token never widens what a page shows.
package paging

import (
	"encoding/base64"
	"errors"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"

	"github.com/fleetstream/fleetstream/pkg/apierr"
)

const (
	// DefaultSize is the page size of a call that gives none (page_size 0). A call without
	// page_size used to get everything; 500 keeps a first page well within a second at 50,000
	// objects while most lists (a project's members, a cluster's namespaces) still fit in one.
	DefaultSize = 500
	// MaxSize bounds a page whatever the caller asks, so one call cannot make the server
	// serialize a whole 50,000-object list.
	MaxSize = 1000
)

// version prefixes every token, so a later format can tell an old token apart.
const version = "p1"

// Request is a List call's paging fields and the names of the list and filters it pages, from
// which a token's fingerprint is made.
type Request struct {
	PageSize  int32
	PageToken string
	// List names the RPC, so a token from another List is refused.
	List string
	// Filters are the call's filter values in a fixed order; a token is good only for the same.
	Filters []string
}

// Page is where a page starts and how long it is.
type Page struct {
	Size  int
	After string // the last key of the previous page; "" for the first
	fp    string
}

// Parse checks a request's paging fields, adding a violation per bad field (page_size,
// page_token) to v.
func Parse(v *apierr.Violations, r Request) Page {
	p := Page{Size: DefaultSize, fp: fingerprint(r.List, r.Filters)}
	switch {
	case r.PageSize < 0:
		v.Add("page_size", "must not be negative, got %d", r.PageSize)
	case r.PageSize > MaxSize:
		v.Add("page_size", "must be at most %d, got %d", MaxSize, r.PageSize)
	case r.PageSize > 0:
		p.Size = int(r.PageSize)
	}
	if r.PageToken != "" {
		after, err := decode(r.PageToken, p.fp)
		if err != nil {
			v.Add("page_token", "%v", err)
		}
		p.After = after
	}
	return p
}

// Slice returns the page of items (sorted by key, keys unique) and the token of the next
// page, "" when this page is the last.
func Slice[T any](p Page, items []T, key func(T) string) ([]T, string) {
	start := 0
	if p.After != "" {
		start = sort.Search(len(items), func(i int) bool { return key(items[i]) > p.After })
	}
	end := min(start+p.Size, len(items))
	page := items[start:end]
	if end == len(items) || len(page) == 0 {
		return page, ""
	}
	return page, encode(key(page[len(page)-1]), p.fp)
}

// SortByKey sorts items by key, for a list put together from more than one source.
func SortByKey[T any](items []T, key func(T) string) {
	sort.SliceStable(items, func(i, j int) bool { return key(items[i]) < key(items[j]) })
}

func fingerprint(list string, filters []string) string {
	h := fnv.New64a()
	h.Write([]byte(list))
	for _, f := range filters {
		// Length-prefixed, so ("ab","c") and ("a","bc") differ.
		h.Write([]byte{0})
		h.Write([]byte(strconv.Itoa(len(f))))
		h.Write([]byte{0})
		h.Write([]byte(f))
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

func encode(after, fp string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(version + "." + fp + "." + after))
}

func decode(tok, fp string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", errors.New("is not a token this list returned")
	}
	parts := strings.SplitN(string(raw), ".", 3)
	if len(parts) != 3 || parts[0] != version || parts[2] == "" {
		return "", errors.New("is not a token this list returned")
	}
	if parts[1] != fp {
		return "", errors.New("was returned for another list or other filters: repeat the filters of the call that returned it")
	}
	return parts[2], nil
}

// All calls page with "" and then with each next token it returns, until one returns "": for a
// caller that needs every object (an export, a check over a whole list).
func All(page func(token string) (next string, err error)) error {
	token := ""
	for {
		next, err := page(token)
		if err != nil {
			return err
		}
		if next == "" {
			return nil
		}
		if next == token {
			// A server answering the same token again would loop forever.
			return errors.New("the server returned the page token it was given")
		}
		token = next
	}
}
