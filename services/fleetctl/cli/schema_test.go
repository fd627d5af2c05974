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

// TestCRDFilesUpToDate: the kube bridge's CRDs (services/kube-bridge/crds, which it embeds and
// installs) are what `fleetctl schema --crd-dir` writes now: one schema source for manifests and
// custom resources.
func TestCRDFilesUpToDate(t *testing.T) {
	dir := "../../kube-bridge/crds"
	for _, name := range manifest.CRDKinds {
		file, want, err := crdYAML(manifest.KindNamed(name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil || string(got) != string(want) {
			t.Errorf("services/kube-bridge/crds/%s is stale or missing (%v): run make generate", file, err)
		}
	}
}
