package main

import (
	"syscall"
	"testing"
)

// TestRaiseFileLimit: after raising, the soft limit covers what the clusters want, and a fleet
// within the limit leaves it as it was.
func TestRaiseFileLimit(t *testing.T) {
	var before syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &before); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &before) })

	if err := raiseFileLimit(1); err != nil {
		t.Fatal(err)
	}
	var got syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &got); err != nil {
		t.Fatal(err)
	}
	if got != before {
		t.Fatalf("one cluster changed the limit from %+v to %+v", before, got)
	}

	clusters := int(before.Max/descriptorsPerCluster) + 1 // past the hard limit
	err := raiseFileLimit(clusters)
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &got); err != nil {
		t.Fatal(err)
	}
	want := uint64(clusters)*descriptorsPerCluster + 1024
	switch {
	case err == nil && got.Cur < want:
		t.Fatalf("raised without error to %+v, want at least %d", got, want)
	case err != nil && got != before:
		t.Fatalf("failed (%v) but changed the limit to %+v", err, got)
	case err != nil:
		t.Logf("not privileged to raise the hard limit: %v", err)
	}
}
