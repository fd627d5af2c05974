module github.com/fleetstream/fleetstream/services/cluster-agent

go 1.26.0

require github.com/fleetstream/fleetstream/pkg v0.0.0

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/nats-io/nats.go v1.55.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	go.uber.org/multierr v1.10.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	k8s.io/api v0.34.4 // indirect
	k8s.io/apimachinery v0.34.4 // indirect
	k8s.io/client-go v0.34.4 // indirect
)

// Inside the repository every module uses the local pkg; the replace keeps plain
// `go build` inside this directory working without the workspace.
replace github.com/fleetstream/fleetstream/pkg => ../../pkg
