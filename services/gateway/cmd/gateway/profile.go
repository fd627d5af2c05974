//go:build gatewayprofile

package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
)

// Built only with -tags gatewayprofile, for BenchmarkProcessLatency: with
// FLEETSTREAM_GATEWAY_CPUPROFILE set, SIGUSR1 starts a CPU profile and SIGUSR2 writes it to
// that file, so that the profile covers the benchmark's timed calls and nothing else.
func init() {
	path := os.Getenv("FLEETSTREAM_GATEWAY_CPUPROFILE")
	if path == "" {
		return
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		var f *os.File
		for s := range sig {
			switch {
			case s == syscall.SIGUSR1 && f == nil:
				var err error
				if f, err = os.Create(path + ".tmp"); err != nil {
					fmt.Fprintf(os.Stderr, "gateway: cpu profile: %v\n", err)
					continue
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					fmt.Fprintf(os.Stderr, "gateway: cpu profile: %v\n", err)
				}
			case s == syscall.SIGUSR2 && f != nil:
				pprof.StopCPUProfile()
				_ = f.Close()
				f = nil
				if err := os.Rename(path+".tmp", path); err != nil {
					fmt.Fprintf(os.Stderr, "gateway: cpu profile: %v\n", err)
				}
			}
		}
	}()
}
