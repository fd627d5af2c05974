//go:build unix

package fleetd

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDataDir takes an exclusive lock on the data dir for as long as the file stays open: two
// JetStream servers on one store would corrupt it (fleetd twice, or a rotation while fleetd
// runs).
func lockDataDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "fleetd.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("fleetd: lock data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("fleetd: data dir %s is in use (is fleetd running on it?): %w", dir, err)
	}
	return f, nil
}
