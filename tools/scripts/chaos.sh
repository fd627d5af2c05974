#!/usr/bin/env bash
# make chaos: the fault suite on the production-shaped compose stack (three NATS nodes, two
# replicas of every hub service (deploy/chaos/docker-compose.yml on top of docker-compose.yml),
# the gateway, two member clusters with their agents). Starts it from nothing, runs
# tools/chaos (go test -tags chaos: kill a NATS node, kill the busiest stream's leader, SIGKILL
# lease holders, partition an agent for 60 s, restart the whole stack; under a steady write
# load through the gateway, each checked for lost acknowledged writes and views that differ from
# a rebuild from the streams), writes the figures to .data/chaos-report.md and ALWAYS tears
# down. Images and secrets must exist (make chaos builds them). Runs as root or a docker-group
# user; SIGKILLing a container's process from the host needs root (CI runs as root).
# CHAOS_RUN narrows the run to some scenarios (go test -run), e.g.
#   CHAOS_RUN='TestChaos/restore-from-backup' make chaos
# (the setup runs, then only that scenario, on a stack started from nothing).
set -euo pipefail
source "$(dirname "$0")/compose-lib.sh"
COMPOSE="$COMPOSE -f docker-compose.yml -f deploy/chaos/docker-compose.yml"
export COMPOSE
root=$PWD
report=$root/.data/chaos-report.md

teardown() {
  local rc=$?
  if [ $rc != 0 ]; then
    echo "==> chaos failed; the last lines of every container's log:" >&2
    compose logs --no-color --tail=30 >&2 || true
    # A failure of a scenario's first seconds is often explained by a warning long before the
    # last lines: every hub service's warnings and errors, for the next one to read in CI's log.
    echo "==> chaos failed; every hub service's warnings and errors:" >&2
    compose logs --no-color cluster-import cluster-import-2 namespace-binding namespace-binding-2 rbac-sync rbac-sync-2 \
      endpoint-collector endpoint-collector-2 gateway 2>/dev/null | grep -E '"level":"(warn|error)"|\b(WARN|ERROR)\b' | tail -n 400 >&2 || true
  fi
  echo "==> tearing down"
  compose down -v --remove-orphans >/dev/null 2>&1 || compose down -v --remove-orphans || true
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT TERM

tools/scripts/dev-secrets.sh
compose down -v --remove-orphans >/dev/null 2>&1 || true
tools/scripts/compose-members.sh init
tools/scripts/compose-start.sh
echo "==> chaos suite (tools/chaos)"
rm -f "$report"
(cd tools/chaos && FLEETSTREAM_ROOT="$root" FLEETSTREAM_COMPOSE="$COMPOSE" FLEETSTREAM_CHAOS_REPORT="$report" \
  go test -tags chaos -count=1 -v -timeout 30m -run "${CHAOS_RUN:-TestChaos}" .)
echo "==> figures ($report):"
cat "$report"
