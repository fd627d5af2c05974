#!/usr/bin/env bash
# CI check of the local stack: start docker-compose.yml (images must exist: `make compose-check`
# builds them), wait for every NATS node and service to be ready, smoke-test the API through
# cluster-import with the dev bearer token, and ALWAYS tear down (`down -v`), pass or fail.
set -euo pipefail
source "$(dirname "$0")/compose-lib.sh"

teardown() {
  local rc=$?
  echo "==> tearing down"
  compose down -v --remove-orphans >/dev/null 2>&1 || compose down -v --remove-orphans || true
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT TERM

tools/scripts/dev-secrets.sh
# Start from nothing: a leftover stack of an earlier run would hide startup bugs.
compose down -v --remove-orphans >/dev/null 2>&1 || true
names=""
for sp in $SERVICES; do names="$names ${sp%%:*}"; done
echo "==> starting nats-1 nats-2 nats-3$names"
compose up -d nats-1 nats-2 nats-3 $names

tools/scripts/compose-wait.sh

# Smoke test through the first service that serves the cluster registry (cluster-import).
case " $names " in
*" cluster-import "*)
  url=http://127.0.0.1:18081/fleetstream.cluster.v1.ClusterService
  token=$(cut -d, -f1 .data/compose/api-tokens)
  echo "==> smoke test: unauthenticated call is refused"
  code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d '{}' "$url/ListClusters")
  [ "$code" = 401 ] || { echo "want 401 without a token, got $code" >&2; exit 1; }
  echo "==> smoke test: RegisterCluster, then ListClusters"
  out=$(curl -sS -f -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -d '{"name":"smoke","labels":{"env":"ci"}}' "$url/RegisterCluster") ||
    { echo "RegisterCluster failed: $out" >&2; compose logs --no-color --tail=80 cluster-import >&2; exit 1; }
  list=""
  for _ in $(seq 1 20); do
    list=$(curl -sS -f -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d '{}' "$url/ListClusters") || true
    case "$list" in *'"smoke"'*) break ;; esac
    sleep 0.5
  done
  case "$list" in
  *'"smoke"'*) echo "    registered cluster is listed" ;;
  *) echo "registered cluster not listed: $list" >&2; compose logs --no-color --tail=80 cluster-import >&2; exit 1 ;;
  esac
  ;;
esac
# Every stream (and KV bucket) the services created must be replicated on all three nodes.
echo "==> every JetStream stream has 3 replicas"
jsz=$(curl -sS -f 'http://127.0.0.1:18222/jsz?streams=true&config=true')
replicas=$(printf '%s' "$jsz" | grep -o '"num_replicas": *[0-9]*' | grep -o '[0-9]*$' | sort | uniq -c || true)
echo "${replicas:-    (no streams)}" | sed 's/^ */    streams: /; s/ \([0-9]*\)$/ with replicas=\1/'
if printf '%s' "$jsz" | grep -q '"num_replicas": *[0-24-9]'; then
  echo "some streams are not R3: is --replicas honoured?" >&2; exit 1
fi
echo "==> compose check passed"
