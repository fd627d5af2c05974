module github.com/fleetstream/fleetstream/examples/access-audit

go 1.26.0

require (
	github.com/fleetstream/fleetstream/pkg v0.0.0
	// Only the end-to-end test runs fleetd.
	github.com/fleetstream/fleetstream/services/fleetd v0.0.0
	go.uber.org/zap v1.28.0
)

// Inside the repository the workspace (go.work) provides these modules.
replace (
	github.com/fleetstream/fleetstream/pkg => ../../pkg
	github.com/fleetstream/fleetstream/services/fleetd => ../../services/fleetd
)
