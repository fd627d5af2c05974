package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetstream/fleetstream/services/fleetctl/manifest"
)

// TestSchemaFilesUpToDate: docs/schemas holds what `fleetctl schema --out-dir` writes now, so
// a field added to an API message reaches the published schemas (make generate).
func TestSchemaFilesUpToDate(t *testing.T) {
	dir := "../../../docs/schemas"
	for _, k := range manifest.Kinds() {
		want, err := schemaJSON(k)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, k.Name+".json"))
		if err != nil || string(got) != string(want) {
			t.Errorf("docs/schemas/%s.json is stale or missing (%v): run make generate", k.Name, err)
		}
	}
}
