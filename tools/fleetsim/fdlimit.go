package main

import (
	"fmt"
	"syscall"
)

// descriptorsPerCluster is what one simulated cluster holds open at most: its NATS connection,
// a connection to the hub's API, and one more while a reconnect overlaps the old socket's close.
// The run's own needs (the hub's log, profiles, results, the child hub's pipes) come on top.
const descriptorsPerCluster = 3

// raiseFileLimit lifts this process's open-file limit to what clusters simulated clusters need.
// Go raises the soft limit to the hard one at start; at 10,000 clusters a hard limit of 20,000
// left nothing for the storm's profile file, so the hard limit is raised too where the process
// may (root, or CAP_SYS_RESOURCE), up to the kernel's fs.nr_open. Where it may not, the error
// says how many descriptors the run wants, so the operator can raise it before a long run
// fails half way.
func raiseFileLimit(clusters int) error {
	want := uint64(clusters)*descriptorsPerCluster + 1024
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("open-file limit: %w", err)
	}
	if lim.Cur >= want {
		return nil
	}
	next := syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next); err != nil {
		return fmt.Errorf("%d clusters want %d open files, the limit is %d (hard %d) and could not be raised: %w (raise it with `ulimit -n %d` as root)",
			clusters, want, lim.Cur, lim.Max, err, want)
	}
	return nil
}
