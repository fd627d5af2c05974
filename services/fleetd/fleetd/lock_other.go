//go:build !unix

package fleetd

import (
	"fmt"
	"os"
	"path/filepath"
)

// lockDataDir only marks the data dir where flock does not exist: nothing stops a second
// fleetd there.
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "fleetd.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("fleetd: lock data dir: %w", err)
	}
	return f, nil
}
