package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/fleetstream/fleetstream/services/fleetctl/manifest"
)

// Field ownership, as Kubernetes server-side apply keeps it in managedFields: an apply set owns
// the fields it last applied, and apply refuses to overwrite a field that someone else changed
// since (another apply set, an API call, a fleetctl command) unless --force-conflicts.
//
// The record of what a set last applied is kept by fleetctl, one file per apply set and server
// (applySetRecord): the API has no object to hold it, nor a way to read who made an object's
// last change (docs/fleet-as-code.md says what the hub-side record would need).

// applySetRecord is what one apply set last applied to one server: per object key, its leaf
// fields (manifest.Fields) as applied.
type applySetRecord struct {
	ApplySet string                  `json:"applySet"`
	Server   string                  `json:"server"`
	Objects  map[string]*recordEntry `json:"objects"`
}

type recordEntry struct {
	Fields map[string]string `json:"fields"`
}

// recordStore keeps the apply sets' records of one server in a directory: <dir>/<set>.json.
// A record names its server, and one of another server is refused (load), not read.
type recordStore struct {
	dir    string
	server string
}

var unsafePathRE = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// newRecordStore is the store under dir, or else beside the configuration file
// (applysets/<server>/), so that a context's records stay with it.
func newRecordStore(f *factory, dir string) (*recordStore, error) {
	server, err := f.serverURL()
	if err != nil {
		return nil, err
	}
	if dir == "" {
		cfg, err := configPath()
		if err != nil {
			return nil, err
		}
		dir = filepath.Join(filepath.Dir(cfg), "applysets", unsafePathRE.ReplaceAllString(strings.TrimPrefix(strings.TrimPrefix(server, "http://"), "https://"), "_"))
	}
	return &recordStore{dir: dir, server: server}, nil
}

func (s *recordStore) path(set string) string { return filepath.Join(s.dir, set+".json") }

// load returns set's record, nil when there is none yet.
func (s *recordStore) load(set string) (*applySetRecord, error) {
	data, err := os.ReadFile(s.path(set))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the record of apply set %s: %w", set, err)
	}
	var r applySetRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("read the record of apply set %s (%s): %w", set, s.path(set), err)
	}
	if r.Server != "" && r.Server != s.server {
		// An explicit --applyset-records DIR is not keyed by server: the same set name applied
		// to staging and prod from one directory would read staging's record in prod's apply,
		// and a hand change in prod equal to staging's value would pass as the set's own.
		return nil, &foreignRecordError{set: set, path: s.path(set), recorded: r.Server, current: s.server}
	}
	if r.Objects == nil {
		r.Objects = map[string]*recordEntry{}
	}
	return &r, nil
}

// foreignRecordError: the record found is of another server than the one apply talks to.
type foreignRecordError struct {
	set, path, recorded, current string
}

func (e *foreignRecordError) Error() string {
	return fmt.Sprintf("the record of apply set %s (%s) is of server %s, not of the current server %s: "+
		"give each server its own --applyset-records directory", e.set, e.path, e.recorded, e.current)
}

// others returns the records of the other apply sets kept here, by set name: who else may
// have written a field.
func (s *recordStore) others(set string) (map[string]*applySetRecord, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]*applySetRecord{}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || name == set || e.IsDir() {
			continue
		}
		r, err := s.load(name)
		var foreign *foreignRecordError
		if errors.As(err, &foreign) {
			continue // another server's set wrote nothing here
		}
		if err != nil {
			return nil, err
		}
		out[name] = r
	}
	return out, nil
}

// save writes r whole, through a temporary file renamed over the old one, so that a crash
// leaves either record, never half of one.
func (s *recordStore) save(r *applySetRecord) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	r.Server = s.server
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, "."+r.ApplySet+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), s.path(r.ApplySet))
}

// ownership is what apply knows about who owns the fields of the objects it plans.
type ownership struct {
	set string
	// mine is the set's record; nil when the set has none here yet (its first apply from
	// this record store), in which case only fields another recorded set owns conflict.
	mine   *applySetRecord
	others map[string]*applySetRecord
}

func loadOwnership(store *recordStore, set string) (*ownership, error) {
	mine, err := store.load(set)
	if err != nil {
		return nil, err
	}
	others, err := store.others(set)
	if err != nil {
		return nil, fmt.Errorf("read the records of the other apply sets: %w", err)
	}
	return &ownership{set: set, mine: mine, others: others}, nil
}

// fieldConflict is one field that applying would overwrite although someone else changed it
// since this apply set last applied it.
type fieldConflict struct {
	path     string
	by       string // who changed it, as far as the records tell
	applied  bool   // this set had applied the field before
	live     string
	declared string // "" when the manifest does not set it (apply would remove it)
	// hidden: the values are not shown (an import policy's template may hold a credential
	// written through the API, and apply's output goes to CI logs).
	hidden bool
}

func (c fieldConflict) String() string {
	var b strings.Builder
	b.WriteString(c.path)
	b.WriteString(": ")
	if c.applied {
		fmt.Fprintf(&b, "changed by %s since this apply set last applied it", c.by)
	} else {
		fmt.Fprintf(&b, "set by %s, not by this apply set", c.by)
	}
	switch {
	case c.hidden && c.declared == "":
		b.WriteString("; the manifest does not set it (apply would remove it; values not shown: they may hold credentials)")
		return b.String()
	case c.hidden:
		b.WriteString("; live and manifest differ (values not shown: they may hold credentials)")
		return b.String()
	}
	fmt.Fprintf(&b, "; live %s, ", shortValue(c.live))
	if c.declared == "" {
		b.WriteString("manifest does not set it (apply would remove it)")
	} else {
		fmt.Fprintf(&b, "manifest %s", shortValue(c.declared))
	}
	return b.String()
}

// shortValue keeps a conflict on one readable line: a long value (a template, a list of rules)
// is cut.
func shortValue(v string) string {
	const max = 60
	if len(v) <= max {
		return v
	}
	return v[:max] + "…"
}

const otherWriter = "another writer (an API call, a fleetctl command, or an apply set without a record here)"

// conflicts returns the fields of o that applying it over live would overwrite against
// someone else's change, in path order. A field conflicts when its live value differs from
// what the manifest says and is not what this set last applied: set since by someone else, or
// never applied by this set. A field that is absent live conflicts with nobody (no one owns
// it); one this set applied and the manifest no longer sets is released, which apply does by
// removing it unless someone else changed it since (then it conflicts: removing it would
// undo their change).
func (w *ownership) conflicts(o *manifest.Object, live *liveObject) ([]fieldConflict, error) {
	if live == nil {
		return nil, nil
	}
	declared, err := manifest.Fields(o)
	if err != nil {
		return nil, err
	}
	have, err := manifest.Fields(live.obj)
	if err != nil {
		return nil, err
	}
	key := o.Key()
	var applied map[string]string
	if w.mine != nil && w.mine.Objects[key] != nil {
		applied = w.mine.Objects[key].Fields
	}
	var out []fieldConflict
	for _, p := range slices.Sorted(maps.Keys(have)) {
		lv := have[p]
		dv, declares := declared[p]
		if declares && dv == lv {
			continue
		}
		av, had := applied[p]
		if had && av == lv {
			continue // live is what this set applied: its own field
		}
		by := w.ownerOf(key, p, lv)
		if by == "" {
			if w.mine == nil {
				// No record of this set yet: only a recorded set's field is known to be
				// someone else's; the rest is taken over, as apply did before records.
				continue
			}
			by = otherWriter
		}
		out = append(out, fieldConflict{path: p, by: by, applied: had, live: lv, declared: dv, hidden: hiddenField(o.Kind.Name, p)})
	}
	return out, nil
}

// hiddenField reports whether the values of kind's field at path are kept out of messages.
func hiddenField(kind, path string) bool {
	return kind == "ImportPolicy" && path == "spec.template"
}

// ownerOf names the other apply set whose record says it applied value to the field, or "".
func (w *ownership) ownerOf(key, path, value string) string {
	for _, name := range slices.Sorted(maps.Keys(w.others)) {
		if e := w.others[name].Objects[key]; e != nil && e.Fields[path] == value {
			return "apply set " + name
		}
	}
	return ""
}

// recordApplied returns the set's record after an apply: every declared object that is now as
// declared (applied, or unchanged) owns the fields its manifest sets; a failed object keeps
// what the set had applied before; objects no longer declared are released.
func (w *ownership) recordApplied(planned []*plannedObject) (*applySetRecord, error) {
	next := &applySetRecord{ApplySet: w.set, Objects: map[string]*recordEntry{}}
	for _, p := range planned {
		key := p.obj.Key()
		if p.err != nil {
			if w.mine != nil && w.mine.Objects[key] != nil {
				next.Objects[key] = w.mine.Objects[key]
			}
			continue
		}
		fields, err := manifest.Fields(p.obj)
		if err != nil {
			return nil, err
		}
		next.Objects[key] = &recordEntry{Fields: fields}
	}
	return next, nil
}
