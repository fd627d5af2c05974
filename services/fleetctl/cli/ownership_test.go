package cli

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetstream/fleetstream/services/fleetctl/manifest"
)

// TestConflicts: which fields conflict, and how each is named, for every case of who last
// wrote a field.
func TestConflicts(t *testing.T) {
	obj := func(spec string) *manifest.Object {
		t.Helper()
		objs, err := manifest.Decode("f.yaml", strings.NewReader("apiVersion: fleetstream.io/v1alpha1\nkind: Project\nmetadata: {name: team-a}\nspec: "+spec+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		return objs[0]
	}
	const key = "Project/team-a"
	record := func(fields map[string]string) *applySetRecord {
		return &applySetRecord{Objects: map[string]*recordEntry{key: {Fields: fields}}}
	}
	const cpu = "spec.budgets[cluster=eu-1].hard.cpu"
	tests := map[string]struct {
		declared, live string
		mine           *applySetRecord // nil: no record of this set yet
		others         map[string]*applySetRecord
		want           []string
	}{
		"live is what the set applied: the manifest's change is no conflict": {
			declared: `{budgets: [{cluster: eu-1, hard: {cpu: "4"}}]}`, live: `{budgets: [{cluster: eu-1, hard: {cpu: "8"}}]}`,
			mine: record(map[string]string{"spec.budgets[cluster=eu-1].cluster": `"eu-1"`, cpu: `"8"`}),
		},
		"changed by someone since the set applied it": {
			declared: `{budgets: [{cluster: eu-1, hard: {cpu: "4"}}]}`, live: `{budgets: [{cluster: eu-1, hard: {cpu: "8"}}]}`,
			mine: record(map[string]string{"spec.budgets[cluster=eu-1].cluster": `"eu-1"`, cpu: `"4"`}),
			want: []string{cpu + `: changed by ` + otherWriter + ` since this apply set last applied it; live "8", manifest "4"`},
		},
		"changed by another apply set": {
			declared: `{budgets: [{cluster: eu-1, hard: {cpu: "4"}}]}`, live: `{budgets: [{cluster: eu-1, hard: {cpu: "8"}}]}`,
			mine:   record(map[string]string{cpu: `"4"`}),
			others: map[string]*applySetRecord{"b": record(map[string]string{cpu: `"6"`}), "c": record(map[string]string{cpu: `"8"`})},
			want:   []string{cpu + `: changed by apply set c since this apply set last applied it; live "8", manifest "4"`},
		},
		"never applied by this set, which has a record": {
			declared: `{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: "4"}}]}`, live: `{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: "8"}}]}`,
			mine: &applySetRecord{Objects: map[string]*recordEntry{}},
			want: []string{cpu + `: set by ` + otherWriter + `, not by this apply set; live "8", manifest "4"`},
		},
		"no record of this set yet: only a recorded set's field conflicts": {
			declared: `{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: "4"}}, {cluster: us-1, hard: {cpu: "1"}}]}`,
			live:     `{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: "8"}}, {cluster: us-1, hard: {cpu: "2"}}]}`,
			others:   map[string]*applySetRecord{"a": record(map[string]string{cpu: `"8"`})},
			want:     []string{cpu + `: set by apply set a, not by this apply set; live "8", manifest "4"`},
		},
		"released: the set applied it, nobody changed it, the manifest dropped it": {
			declared: `{displayName: A}`, live: `{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: "8"}}]}`,
			mine: record(map[string]string{"spec.budgets[cluster=eu-1].cluster": `"eu-1"`, cpu: `"8"`}),
		},
		"dropped by the manifest but changed by someone since: removing it would undo them": {
			declared: `{displayName: A}`, live: `{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: "9"}}]}`,
			mine: record(map[string]string{"spec.budgets[cluster=eu-1].cluster": `"eu-1"`, cpu: `"8"`}),
			want: []string{cpu + `: changed by ` + otherWriter + ` since this apply set last applied it; live "9", manifest does not set it (apply would remove it)`},
		},
		"absent live: nobody owns it": {
			declared: `{displayName: A, budgets: [{cluster: eu-1, hard: {cpu: "4"}}]}`, live: `{displayName: A}`,
			mine: &applySetRecord{Objects: map[string]*recordEntry{}},
		},
		"a long value is cut": {
			declared: `{displayName: A}`, live: `{displayName: "` + strings.Repeat("x", 100) + `"}`,
			mine: record(map[string]string{"spec.displayName": `"A"`}),
			want: []string{`spec.displayName: changed by ` + otherWriter + ` since this apply set last applied it; live "` + strings.Repeat("x", 59) + `…, manifest "A"`},
		},
	}
	t.Run("an import policy's template is not quoted", func(t *testing.T) {
		policy := func(template string) *manifest.Object {
			objs, err := manifest.Decode("f.yaml", strings.NewReader("apiVersion: fleetstream.io/v1alpha1\nkind: ImportPolicy\nmetadata: {name: capi}\nspec: {template: "+template+"}\n"))
			if err != nil {
				t.Fatal(err)
			}
			return objs[0]
		}
		w := &ownership{set: "mine", mine: &applySetRecord{Objects: map[string]*recordEntry{}}}
		// Written through the API, where a template may carry a literal credential.
		got, err := w.conflicts(policy(`"labels: {a: b}"`), &liveObject{obj: policy(`"labels: {a: s3cr3t}"`)})
		if err != nil {
			t.Fatal(err)
		}
		want := "spec.template: set by " + otherWriter + ", not by this apply set; live and manifest differ (values not shown: they may hold credentials)"
		if len(got) != 1 || got[0].String() != want {
			t.Errorf("conflicts: %v, want %q", got, want)
		}
	})
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			w := &ownership{set: "mine", mine: tt.mine, others: tt.others}
			got, err := w.conflicts(obj(tt.declared), &liveObject{obj: obj(tt.live)})
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			for _, c := range got {
				lines = append(lines, c.String())
			}
			if !slices.Equal(lines, tt.want) {
				t.Errorf("conflicts:\n got %q\nwant %q", lines, tt.want)
			}
		})
	}
}

// TestRecordOfAnotherServer: one --applyset-records directory used for staging and prod with
// the same set name. prod's apply must not read staging's record as its own (a hand change in
// prod equal to staging's value would pass as the set's field and be overwritten); another
// set's record of another server says nothing about who wrote prod's fields.
func TestRecordOfAnotherServer(t *testing.T) {
	dir := t.TempDir()
	staging := &recordStore{dir: dir, server: "https://staging.example:8443"}
	prod := &recordStore{dir: dir, server: "https://prod.example:8443"}
	rec := func(set string) *applySetRecord {
		return &applySetRecord{ApplySet: set, Objects: map[string]*recordEntry{"Project/team-a": {Fields: map[string]string{"spec.displayName": `"A"`}}}}
	}
	for _, set := range []string{"fleet", "platform"} {
		if err := staging.save(rec(set)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := loadOwnership(staging, "fleet"); err != nil {
		t.Fatalf("staging reading its own record: %v", err)
	}
	_, err := loadOwnership(prod, "fleet")
	if err == nil {
		t.Fatal("prod read staging's record of the same set as its own")
	}
	for _, want := range []string{"https://staging.example:8443", "https://prod.example:8443", "--applyset-records", filepath.Join(dir, "fleet.json")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if err := prod.save(rec("web")); err != nil {
		t.Fatal(err)
	}
	own, err := loadOwnership(prod, "web")
	if err != nil {
		t.Fatalf("prod's set beside staging's records: %v", err)
	}
	if len(own.others) != 0 {
		t.Fatalf("prod's set counts staging's sets as writers of prod: %v", slices.Collect(maps.Keys(own.others)))
	}
}
