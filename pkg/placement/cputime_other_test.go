//go:build !unix

package placement

import "time"

// processCPU is not measured here: the CPU metrics then report 0.
func processCPU() time.Duration { return 0 }
