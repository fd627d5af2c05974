package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/fleetstream/fleetstream/services/fleetctl/manifest"
)

func newSchemaCommand(f *factory) *cobra.Command {
	var outDir string
	cmd := &cobra.Command{
		Use:   "schema KIND | --out-dir DIR",
		Short: "Print the JSON Schema of a manifest kind",
		Long: "Schema prints the JSON Schema (draft 2020-12) of manifests of KIND, generated from the API message the kind's spec is, so an editor or a CI validator checks a manifest as apply does: " +
			"unknown fields are errors, enums list their names. With --out-dir it writes every kind's schema there as <Kind>.json (make generate keeps docs/schemas so).",
		Example: "  fleetctl schema Cluster > cluster.schema.json\n  fleetctl schema --out-dir docs/schemas",
		Args: func(cmd *cobra.Command, args []string) error {
			if outDir == "" && len(args) != 1 {
				return fmt.Errorf("accepts 1 arg(s), received %d", len(args))
			}
			if outDir != "" && len(args) != 0 {
				return errors.New("KIND and --out-dir are mutually exclusive")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if outDir != "" {
				if err := os.MkdirAll(outDir, 0o755); err != nil {
					return err
				}
				for _, k := range manifest.Kinds() {
					b, err := schemaJSON(k)
					if err != nil {
						return err
					}
					if err := os.WriteFile(filepath.Join(outDir, k.Name+".json"), b, 0o644); err != nil {
						return err
					}
				}
				return nil
			}
			k := manifest.KindNamed(args[0])
			if k == nil {
				return fmt.Errorf("unknown kind %q, want one of %s", args[0], kindList())
			}
			b, err := schemaJSON(k)
			if err != nil {
				return err
			}
			_, err = f.streams.Out.Write(b)
			return err
		},
	}
	cmd.Flags().StringVar(&outDir, "out-dir", "", "write every kind's schema to DIR/<Kind>.json instead")
	return cmd
}

func schemaJSON(k *manifest.Kind) ([]byte, error) {
	b, err := json.MarshalIndent(k.Schema(), "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
