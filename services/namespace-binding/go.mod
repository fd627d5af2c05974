module github.com/fleetstream/fleetstream/services/namespace-binding

go 1.26.0

require github.com/fleetstream/fleetstream/pkg v0.0.0

// Inside the repository every module uses the local pkg; the replace keeps plain
// `go build` inside this directory working without the workspace.
replace github.com/fleetstream/fleetstream/pkg => ../../pkg
