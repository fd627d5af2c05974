# Fleetstream: the front door. `make help` lists the targets.
#
# Every target works from a fresh clone with only Go, gcc, git and make (plus Docker for the
# image and compose targets). Tools are pinned and installed into ./bin, never taken from PATH.

SHELL       := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS   += --no-print-directory

GO      ?= go
ROOT    := $(CURDIR)
BIN     := $(ROOT)/bin
DATA    := $(ROOT)/.data

# Every module of go.work, as `<dir>/...` patterns. `go test ./...` at the root of a workspace
# covers no module at all, so every target below iterates these instead.
MODULE_DIRS = $(shell $(GO) list -m -f '{{.Dir}}')
PKGS        = $(addsuffix /...,$(MODULE_DIRS))

# Pinned code generators (see `generate`).
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_CONNECT_VERSION := v1.21.1
BUF_VERSION                := v1.75.0
# staticcheck 2026.2.2
STATICCHECK_VERSION        := v0.8.2
# Helm for `make chart-check` (built from source like the others; ~9 min cold on 2 cores).
HELM_VERSION               := v3.22.0
# promtool for `make monitoring-check` (Prometheus v3.16.0's Go module version; built from source
# like helm).
PROMTOOL_VERSION           := v0.316.0
# The NATS CLI (`nats`) the alerts' runbooks in docs/operations.md use, for the test that runs
# every one of their commands (TestOperationsRunbookNATSCommands); built from source like helm.
NATSCLI_VERSION            := v0.5.0

# Binaries: name -> main package.
PKG_fleetd             := ./services/fleetd/cmd/fleetd
PKG_fleetctl           := ./services/fleetctl
PKG_cluster-import     := ./services/cluster-import/cmd/cluster-import
PKG_namespace-binding  := ./services/namespace-binding/cmd/namespace-binding
PKG_rbac-sync          := ./services/rbac-sync/cmd/rbac-sync
PKG_endpoint-collector := ./services/endpoint-collector/cmd/endpoint-collector
PKG_cluster-agent      := ./services/cluster-agent/cmd/cluster-agent
PKG_kube-bridge        := ./services/kube-bridge/cmd/kube-bridge
PKG_gateway            := ./services/gateway/cmd/gateway
# nats-server's main package is its module root; pkg/go.mod pins the version (v2.15.2).
PKG_nats               := github.com/nats-io/nats-server/v2
# The member clusters of the compose stack: the test kit's static binaries, built once from the Go
# module proxy into a cache (tools/build-test-assets.sh; versions in tools/{kube-apiserver,etcd}/go.mod).
PKG_etcd               := test-assets
PKG_kube-apiserver     := test-assets

# Images: fleetstream/<name>:$(IMAGE_TAG), one per binary, FROM scratch (deploy/images/<name>).
IMAGES      ?= nats fleetd cluster-import namespace-binding rbac-sync endpoint-collector cluster-agent gateway kube-bridge \
               etcd kube-apiserver
IMAGE_REPO  ?= fleetstream
IMAGE_TAG   ?= latest
# Static, reproducible binaries: no cgo, no paths or VCS state baked in.
# The version every binary reports (pkg/version): the commit, "-dirty" with local changes.
VERSION     ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
VERSION_LDFLAG = -X github.com/fleetstream/fleetstream/pkg/version.Version=$(VERSION)
STATIC_BUILD = CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags='-s -w $(VERSION_LDFLAG)'

# Docker Compose: the standalone `docker-compose` (v1 or v2) if installed, else the `docker compose`
# plugin. The project name is compose's default (this directory's name), so plain
# `docker-compose ps/logs` here see the same stack; set COMPOSE_PROJECT_NAME to change it.
COMPOSE ?= $(shell command -v docker-compose >/dev/null 2>&1 && echo docker-compose || echo docker compose)
export FLEETSTREAM_IMAGE_TAG := $(IMAGE_TAG)

# Tests and benchmarks.
TEST_TIMEOUT ?= 45m
TESTFLAGS    ?=
BENCH        ?= .
BENCHTIME    ?= 1s
BENCHFLAGS   ?=

# `make test-browser`: where the console's screenshots go (none when empty).
SCREENSHOTS ?=

# `make run`
LISTEN      ?= 127.0.0.1:8080
FLEETD_ARGS ?=

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Develop

.PHONY: build
build: ## build fleetd, fleetctl and cluster-agent into ./bin
	@mkdir -p $(BIN)
	$(GO) build -buildvcs=false -ldflags='$(VERSION_LDFLAG)' -o $(BIN)/ $(PKG_fleetd) $(PKG_fleetctl) $(PKG_cluster-agent)

$(DATA)/tokens:
	@mkdir -p $(DATA) && chmod 700 $(DATA)
	@umask 077 && printf '%s,dev-admin\n' "$$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" > $@
	@echo "created $@ (a random bearer token for user dev-admin; delete the file to get a new one)"

# The operator's NATS identity on fleetd's embedded server (fleetctl admin backup).
$(DATA)/nats-admin.token:
	@mkdir -p $(DATA) && chmod 700 $(DATA)
	@umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > $@ && echo >> $@
	@echo "created $@ (the NATS token of fleetctl admin backup; delete the file to get a new one)"

.PHONY: run
run: build $(DATA)/tokens $(DATA)/nats-admin.token ## build and start fleetd in the foreground (embedded NATS, auth on)
	@mkdir -p $(DATA)/fleetd
	@echo
	@echo "fleetd: API http://$(LISTEN), data $(DATA)/fleetd, tokens $(DATA)/tokens (Ctrl-C stops it)"
	@echo "In another shell:"
	@echo "  export FLEETSTREAM_SERVER=http://$(LISTEN)"
	@echo "  export FLEETSTREAM_TOKEN_FILE=$(DATA)/tokens"
	@echo "  bin/fleetctl cluster list"
	@echo "You are signed in as dev-admin (a platform admin). To make alice the owner of team-a:"
	@echo "  printf '%s,alice\\n' \"\$$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n')\" >> $(DATA)/tokens   (then restart make run)"
	@echo "  bin/fleetctl project create team-a && bin/fleetctl member add team-a --user alice --role project-owner"
	@echo "or with curl (Connect JSON):"
	@echo "  curl -H \"Authorization: Bearer \$$(head -n1 $(DATA)/tokens | cut -d, -f1)\" -H 'Content-Type: application/json' -d '{}' http://$(LISTEN)/fleetstream.cluster.v1.ClusterService/ListClusters"
	@echo
	exec $(BIN)/fleetd --data-dir $(DATA)/fleetd --listen $(LISTEN) --token-file $(DATA)/tokens --platform-admins dev-admin \
		--nats-admin-token-file $(DATA)/nats-admin.token $(FLEETD_ARGS)

##@ Test

.PHONY: run-check
run-check: ## start `make run` in the background, wait for `fleetctl cluster list`, stop it
	@tools/scripts/run-check.sh

.PHONY: test-assets
test-assets: ## build kube-apiserver and etcd for the tests (cached under ~/.cache/fleetstream)
	@tools/build-test-assets.sh

.PHONY: test
test: ## run go vet and every test of every module (builds the test assets first)
	@echo "==> test assets (kube-apiserver, etcd; several minutes the first time)"
	@assets=$$(tools/build-test-assets.sh) && echo "    $$assets"
	@# vet and test both run even when the other fails, so one run reports every problem.
	@rc=0; \
	echo "==> go vet"; \
	$(GO) vet $(PKGS) || { rc=1; echo "go vet FAILED" >&2; }; \
	echo "==> go test -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) (every module)"; \
	KUBEBUILDER_ASSETS=$$(tools/build-test-assets.sh) $(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) $(PKGS) \
		|| { rc=1; echo "go test FAILED" >&2; }; \
	exit $$rc

.PHONY: test-browser
test-browser: ## the web console in headless Chromium (Debian's `chromium`) against fleetd; fails without one; SCREENSHOTS=dir saves a PNG of each page
	FLEETSTREAM_REQUIRE_BROWSER=1 FLEETSTREAM_SCREENSHOTS=$(SCREENSHOTS) \
		$(GO) test -count=1 -timeout 5m -v -run '^TestConsoleInABrowser$$' $(TESTFLAGS) ./services/fleetd/fleetd/

.PHONY: test-runbooks
test-runbooks: nats-cli ## every NATS CLI command of docs/operations.md's alert runbooks, run as the runbooks say against fleetd (builds bin/nats: ~4 min cold)
	FLEETSTREAM_REQUIRE_NATS_CLI=1 $(GO) test -count=1 -timeout 5m -v -run '^TestOperationsRunbookNATSCommands$$' $(TESTFLAGS) ./services/fleetd/fleetd/

.PHONY: screenshots
screenshots: ## refresh the README's console screenshots (docs/screenshots) from the browser test's real fleetd
	rm -rf docs/screenshots.tmp
	@$(MAKE) test-browser SCREENSHOTS=$(CURDIR)/docs/screenshots.tmp
	rm -rf docs/screenshots && mv docs/screenshots.tmp docs/screenshots

.PHONY: test-race
test-race: ## every test of every module under the race detector (what CI also runs)
	@$(MAKE) test TESTFLAGS='-race $(TESTFLAGS)'

.PHONY: bench
bench: ## run every benchmark of every module (BENCH=regexp BENCHTIME=1s)
	@mkdir -p $(BIN)
	KUBEBUILDER_ASSETS=$$(tools/build-test-assets.sh) $(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem -count=1 -timeout $(TEST_TIMEOUT) $(BENCHFLAGS) $(PKGS) \
		| grep -v -e '^?' -e '^PASS$$' | tee $(BIN)/bench.txt
	@echo "(saved to bin/bench.txt; compare runs with benchstat)"

# `make backup-scale`: backup and restore time and size of a store of BACKUP_EVENTS events
# (docs/operations.md, "Backup and restore"); 25 s to a minute for 1,000,000 on two shared cores.
BACKUP_EVENTS ?= 1000000

.PHONY: backup-scale
backup-scale: ## time and size of fleetctl admin backup / restore on a store of BACKUP_EVENTS (1000000) events
	cd pkg && BACKUP_EVENTS=$(BACKUP_EVENTS) $(GO) test -count=1 -run '^TestBackupScale$$' -v -timeout 30m ./backup \
		| grep -e 'scale_test' -e '^--- ' -e '^ok' -e FAIL

# `make upgrade-fixture`: record the fixture TestUpgradeFromRecordedFixture restores into every
# later version (docs/operations.md, "Upgrades"): at each release, from the release's commit;
# commit the new directory and keep the previous one. About 30 s (starts a kube-apiserver).
UPGRADE_FIXTURE ?= $(shell date -u +%F)-$(VERSION)
.PHONY: upgrade-fixture
upgrade-fixture: ## record services/fleetd/fleetd/testdata/upgrade/$(UPGRADE_FIXTURE) (at each release)
	cd services/fleetd && UPGRADE_FIXTURE_COMMIT=$$(git rev-parse HEAD) $(GO) test -count=1 -ldflags='$(VERSION_LDFLAG)' \
		-run '^TestRecordUpgradeFixture$$' ./fleetd -record-upgrade-fixture=$(UPGRADE_FIXTURE)

# `make bench-gateway`: the latency the gateway process adds to a Connect unary call against
# what haproxy adds on the same path (docs/benchmarks.md, "Gateway"); ~10 s a run. haproxy is
# the baseline: installed with apt-get when missing and possible (root), else the benchmark
# skips, saying why.
GATEWAY_BENCH_COUNT ?= 3

.PHONY: bench-gateway
bench-gateway: ## the gateway process's added latency against haproxy's (GATEWAY_BENCH_COUNT=3 runs)
	@command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "==> installing haproxy, the benchmark's baseline"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -qq --no-install-recommends haproxy >/dev/null 2>&1 \
	      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends haproxy; } \
	      || echo "haproxy could not be installed: the benchmark will skip"; \
	  else echo "haproxy is not installed (apt-get install -y haproxy as root): the benchmark will skip"; fi; }
	cd services/gateway && $(GO) test -run '^$$' -bench ProcessLatency -benchtime 1x -count $(GATEWAY_BENCH_COUNT) ./gateway

# `make scale`: the fleet simulator (tools/fleetsim) against fleetd as a child process, once per
# size; each size's figures are appended as one JSON line to bin/scale-results.jsonl (delete it
# to start over) and drawn against N into bin/scale.svg (tools/fleetsim/plot).
SIZES           ?= 20 100
SCALE_ROUNDS    ?= 3
SCALE_IDLE      ?= 30s
SCALE_SERVICES  ?= 1000
SCALE_SCENARIOS ?= join,grant,storm,placement,endpoints,steady
SCALE_ARGS      ?=

.PHONY: scale
scale: build ## the fleet simulator against fleetd (a child process), once per size: join, grant → applied on every cluster, a hub restart under the fleet, a namespace following a placement, EndpointSlices → served, an idle fleet's hub CPU and RSS; plotted into bin/scale.svg (SIZES="100 1000" SCALE_ROUNDS=3 SCALE_IDLE=30s SCALE_SERVICES=1000 SCALE_SCENARIOS=... SCALE_ARGS=...)
	$(GO) build -o $(BIN)/fleetsim ./tools/fleetsim
	@for n in $(SIZES); do \
		echo "==> fleetsim -clusters $$n -rounds $(SCALE_ROUNDS) -fleetd bin/fleetd -scenario $(SCALE_SCENARIOS) -services $(SCALE_SERVICES) -idle $(SCALE_IDLE) $(SCALE_ARGS) (JSON in bin/scale-$$n.json)"; \
		$(BIN)/fleetsim -clusters $$n -rounds $(SCALE_ROUNDS) -fleetd $(BIN)/fleetd -scenario $(SCALE_SCENARIOS) -services $(SCALE_SERVICES) -idle $(SCALE_IDLE) \
			-results $(BIN)/scale-results.jsonl $(SCALE_ARGS) > $(BIN)/scale-$$n.json || exit 1; \
	done
	$(GO) run ./tools/fleetsim/plot -o $(BIN)/scale.svg $(BIN)/scale-results.jsonl
	@echo "==> figures against N: bin/scale.svg (from bin/scale-results.jsonl)"

##@ Code generation and lint

# Installs $(2)@$(3) into ./bin unless ./bin/$(1) was already built from exactly that version.
define go-install-tool
@have=$$({ $(GO) version -m $(BIN)/$(1) 2>/dev/null || true; } | awk '$$1 == "mod" {print $$3; exit}'); \
if [ "$$have" != "$(3)" ]; then \
	echo "==> installing $(2)@$(3) into bin/"; \
	GOWORK=off GOBIN=$(BIN) GOFLAGS= $(GO) install $(2)@$(3); \
fi
endef

.PHONY: tools
tools: ## install the pinned tools (buf, protoc-gen-go, protoc-gen-connect-go, staticcheck) into ./bin
	@mkdir -p $(BIN)
	$(call go-install-tool,protoc-gen-go,google.golang.org/protobuf/cmd/protoc-gen-go,$(PROTOC_GEN_GO_VERSION))
	$(call go-install-tool,protoc-gen-connect-go,connectrpc.com/connect/cmd/protoc-gen-connect-go,$(PROTOC_GEN_CONNECT_VERSION))
	$(call go-install-tool,buf,github.com/bufbuild/buf/cmd/buf,$(BUF_VERSION))
	$(call go-install-tool,staticcheck,honnef.co/go/tools/cmd/staticcheck,$(STATICCHECK_VERSION))

.PHONY: helm
helm: ## install the pinned helm into ./bin (separate from `tools`: it takes minutes to build)
	@mkdir -p $(BIN)
	$(call go-install-tool,helm,helm.sh/helm/v3/cmd/helm,$(HELM_VERSION))

.PHONY: promtool
promtool: ## install the pinned promtool into ./bin (for make monitoring-check; minutes to build, like helm)
	@mkdir -p $(BIN)
	$(call go-install-tool,promtool,github.com/prometheus/prometheus/cmd/promtool,$(PROMTOOL_VERSION))

.PHONY: nats-cli
nats-cli: ## install the pinned NATS CLI into ./bin/nats (the runbooks' commands and their test)
	@mkdir -p $(BIN)
	$(call go-install-tool,nats,github.com/nats-io/natscli/nats,$(NATSCLI_VERSION))

# kubectl for `make demo`: its own tool module (tools/kubectl), the member clusters' release.
KUBECTL_VERSION = $(shell grep -oE 'k8s.io/kubectl v[^ ]+' tools/kubectl/go.mod | head -1 | cut -d' ' -f2)
KUBE_VERSION    = $(subst v0.,v1.,$(KUBECTL_VERSION))

.PHONY: kubectl
kubectl: ## build the pinned kubectl into ./bin (for make demo; a few minutes the first time)
	@mkdir -p $(BIN)
	@have=$$({ $(GO) version -m $(BIN)/kubectl 2>/dev/null || true; } | awk '$$1 == "dep" && $$2 == "k8s.io/kubectl" {print $$3; exit}'); \
	if [ "$$have" != "$(KUBECTL_VERSION)" ]; then \
		echo "==> building kubectl $(KUBE_VERSION) (tools/kubectl) into bin/"; \
		cd tools/kubectl && GOWORK=off CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w \
			-X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
			-X k8s.io/client-go/pkg/version.gitVersion=$(KUBE_VERSION)" -o $(BIN)/kubectl .; \
	fi

.PHONY: generate
generate: tools ## buf lint, then regenerate pkg/gen, docs/events.md and docs/schemas (manifest JSON Schemas) and the kube bridge's fleetstream.io CRDs from proto/, and docs/metrics.md from the registered collectors (commit the result)
	PATH=$(BIN):$$PATH $(BIN)/buf lint
	PATH=$(BIN):$$PATH $(BIN)/buf generate
	@$(MAKE) event-catalogue OUT=docs/events.md
	@$(MAKE) metric-catalogue METRICS_OUT=$(CURDIR)/docs/metrics.md
	$(GO) run github.com/fleetstream/fleetstream/services/fleetctl schema --out-dir docs/schemas
	$(GO) run github.com/fleetstream/fleetstream/services/fleetctl schema --crd-dir services/kube-bridge/crds

# The event catalogue is rendered from the protos' descriptors, comments included.
OUT ?= docs/events.md
.PHONY: event-catalogue
event-catalogue:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(BIN)/buf build --as-file-descriptor-set -o "$$tmp/fleetstream.binpb" && \
	$(GO) run github.com/fleetstream/fleetstream/pkg/cmd/eventcatalog "$$tmp/fleetstream.binpb" > "$$tmp/events.md" && \
	mv "$$tmp/events.md" $(OUT)

# The metric catalogue is rendered from the collectors a running fleetd and a gateway register
# (TestMetricCatalogue, which also fails on its own while docs/metrics.md is stale).
METRICS_OUT ?= $(CURDIR)/docs/metrics.md
.PHONY: metric-catalogue
metric-catalogue:
	cd services/fleetd && METRIC_CATALOGUE_OUT="$(METRICS_OUT)" $(GO) test -count=1 -run '^TestMetricCatalogue$$' ./fleetd/

# Generates into a scratch directory and compares with pkg/gen, so the check never rewrites a
# working tree (other people may be editing it) and also catches extra or missing files.
.PHONY: check-generated
check-generated: tools
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	PATH=$(BIN):$$PATH $(BIN)/buf generate -o "$$tmp" && \
	if ! diff -ru pkg/gen "$$tmp/pkg/gen"; then \
		echo "pkg/gen is stale: run 'make generate' and commit the result" >&2; exit 1; \
	fi && echo "pkg/gen is up to date" && \
	$(MAKE) event-catalogue OUT="$$tmp/events.md" && \
	if ! diff -u docs/events.md "$$tmp/events.md"; then \
		echo "docs/events.md is stale: run 'make generate' and commit the result" >&2; exit 1; \
	fi && echo "docs/events.md is up to date" && \
	$(MAKE) metric-catalogue METRICS_OUT="$$tmp/metrics.md" && \
	if ! diff -u docs/metrics.md "$$tmp/metrics.md"; then \
		echo "docs/metrics.md is stale: run 'make generate' and commit the result" >&2; exit 1; \
	fi && echo "docs/metrics.md is up to date"

.PHONY: lint
lint: tools ## gofmt, go vet, staticcheck, buf lint, buf breaking and the staleness of the generated code
	@echo "==> gofmt"
	@out=$$(gofmt -l pkg services tools examples); \
	if [ -n "$$out" ]; then echo "not gofmt-ed (run gofmt -w):" >&2; echo "$$out" >&2; exit 1; fi
	@echo "==> go vet"
	$(GO) vet $(PKGS)
	@echo "==> staticcheck"
	$(BIN)/staticcheck $(PKGS)
	@echo "==> buf lint"
	PATH=$(BIN):$$PATH $(BIN)/buf lint
	@echo "==> buf breaking (APIs and events stay compatible)"
	@BUF=$(BIN)/buf tools/scripts/buf-breaking.sh
	@echo "==> generated code"
	@$(MAKE) check-generated

##@ Images and the local compose stack

.PHONY: images
images: ## build one FROM-scratch image per binary: fleetstream/<name>:latest
	@for name in $(IMAGES); do $(MAKE) image-$$name; done

# make image-<name> builds one image, e.g. make image-rbac-sync
image-%:
	@test -n "$(PKG_$*)" || { echo "unknown image $*" >&2; exit 1; }
	@echo "==> $(IMAGE_REPO)/$*:$(IMAGE_TAG)"
	@rm -rf deploy/images/$*/bin && mkdir -p deploy/images/$*/bin/data
	@if [ "$(PKG_$*)" = test-assets ]; then \
		assets=$$(tools/build-test-assets.sh) && cp "$$assets/$*" deploy/images/$*/bin/$*; \
	elif [ "$*" = nats ]; then \
		cd pkg && $(STATIC_BUILD) -o ../deploy/images/$*/bin/$* $(PKG_$*); \
	else \
		$(STATIC_BUILD) -o deploy/images/$*/bin/$* $(PKG_$*); \
	fi
	docker build -q -t $(IMAGE_REPO)/$*:$(IMAGE_TAG) deploy/images/$*

.PHONY: compose-secrets
compose-secrets:
	@tools/scripts/dev-secrets.sh
	@tools/scripts/compose-members.sh init

.PHONY: compose-up
compose-up: images compose-secrets ## build the images, start the local stack (NATS, services, gateway, two member clusters), register them
	@COMPOSE="$(COMPOSE)" tools/scripts/compose-start.sh
	@echo
	@echo "Stack is up: the API (every service, through the gateway) on http://127.0.0.1:18080,"
	@echo "member clusters east and west Connected (admin kubeconfigs in $(DATA)/compose/members/<name>/)."
	@echo "  make demo      a narrated walkthrough of the fleet"
	@echo "  export FLEETSTREAM_SERVER=http://127.0.0.1:18080 FLEETSTREAM_TOKEN_FILE=$(DATA)/compose/api-tokens"
	@echo "  bin/fleetctl cluster list"
	@echo "Logs: $(COMPOSE) logs -f    Stop: make compose-down"

.PHONY: demo
demo: kubectl ## a narrated walkthrough against the running compose stack (make compose-up first)
	@KUBECTL=$(BIN)/kubectl tools/scripts/demo.sh

.PHONY: compose-check
compose-check: images compose-secrets kubectl ## start the stack, wait until the clusters are Connected, run the demo, smoke-test, always tear down
	@COMPOSE="$(COMPOSE)" KUBECTL=$(BIN)/kubectl tools/scripts/compose-check.sh

.PHONY: chaos
chaos: images compose-secrets ## the fault suite on the compose stack with two replicas per service: kill NATS nodes, crash lease holders, partition an agent, restart all; always tears down
	@COMPOSE="$(COMPOSE)" tools/scripts/chaos.sh

.PHONY: upgrade-check
upgrade-check: images compose-secrets ## the rolling upgrade on the compose stack: N−1's images (deploy/upgrade/previous-release) replaced one replica at a time by N's under load, agents last; always tears down
	@COMPOSE="$(COMPOSE)" tools/scripts/upgrade.sh

.PHONY: chart-check
chart-check: helm ## lint and render the Helm charts, dry-run every object on a real kube-apiserver, prove the agent's least privilege
	@HELM=$(BIN)/helm tools/scripts/chart-check.sh

# The rules and dashboards of deploy/monitoring: promtool checks the rule file and runs its unit
# tests, and tools/monitoring (its own module, outside the workspace) checks every expression of
# the rules and dashboards against docs/metrics.md and every runbook link against
# docs/operations.md.
.PHONY: monitoring-check
monitoring-check: promtool ## promtool check rules and test rules on deploy/monitoring, and every dashboard and rule metric against docs/metrics.md
	$(BIN)/promtool check rules deploy/monitoring/rules/*.yaml
	$(BIN)/promtool test rules deploy/monitoring/tests/*.yaml
	cd tools/monitoring && GOWORK=off $(GO) test -count=1 ./...

.PHONY: compose-down
compose-down: compose-secrets ## stop the local stack and delete its volumes
	$(COMPOSE) down -v --remove-orphans

##@ Housekeeping

.PHONY: clean
clean: ## remove build outputs (./bin, image binaries); `rm -rf .data` also resets local state
	rm -rf $(BIN) deploy/images/*/bin
