//go:build unix

package placement

import (
	"syscall"
	"time"
)

// processCPU is the CPU time the process has used so far, user and system:
// on a loaded machine it leaves out the time spent waiting for a core,
// which wall time counts and which does not depend on the code measured.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
