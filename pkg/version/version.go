// Package version is the version every Fleetstream binary was built as. The Makefile sets it at
// link time:
//
//	go build -ldflags "-X github.com/fleetstream/fleetstream/pkg/version.Version=$(git describe --always --dirty)"
//
// Agents report it in heartbeats (the registry shows each cluster's agent version) and every
// service logs it at start.
package version

// Version is "dev" unless the build set it.
var Version = "dev"
