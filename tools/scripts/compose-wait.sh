#!/usr/bin/env bash
# Waits until every NATS node reports JetStream healthy and every service's and the gateway's
# /readyz answers 200, checked from the host (the scratch images have no shell for in-container healthchecks).
# Prints a status table; on timeout prints the logs of whatever is not ready and exits 1.
#   FLEETSTREAM_COMPOSE_TIMEOUT  seconds to wait (default 120)
set -euo pipefail
source "$(dirname "$0")/compose-lib.sh"
timeout="${FLEETSTREAM_COMPOSE_TIMEOUT:-120}"

probe() { curl -s -o /dev/null -m 3 -w '%{http_code}' "$1" 2>/dev/null || true; }

declare -A status
check_all() {
  local ok=0 name port
  for np in $NATS_NODES; do
    name=${np%%:*} port=${np##*:}
    status[$name]=$(probe "http://127.0.0.1:$port/healthz?js-enabled-only=true")
    [ "${status[$name]}" = 200 ] || ok=1
  done
  for sp in $SERVICES; do
    name=${sp%%:*} port=${sp##*:}
    status[$name]=$(probe "http://127.0.0.1:$port/readyz")
    [ "${status[$name]}" = 200 ] || ok=1
  done
  return $ok
}

print_status() {
  local name port
  printf '  %-20s %-34s %s\n' SERVICE PROBE HTTP
  for np in $NATS_NODES; do
    name=${np%%:*} port=${np##*:}
    printf '  %-20s %-34s %s\n' "$name" ":$port/healthz?js-enabled-only" "${status[$name]:-000}"
  done
  for sp in $SERVICES; do
    name=${sp%%:*} port=${sp##*:}
    printf '  %-20s %-34s %s\n' "$name" ":$port/readyz" "${status[$name]:-000}"
  done
}

start=$(date +%s)
echo "==> waiting up to ${timeout}s for NATS and every service to be ready"
while ! check_all; do
  if [ $(($(date +%s) - start)) -ge "$timeout" ]; then
    print_status
    echo "NOT READY after ${timeout}s" >&2
    compose ps >&2 || true
    for n in ${!status[@]}; do
      if [ "${status[$n]}" != 200 ]; then
        echo "----- logs of $n (last 80 lines) -----" >&2
        compose logs --no-color --tail=80 "$n" >&2 || true
        # The body of /readyz names the failing check.
        for sp in $SERVICES; do
          [ "${sp%%:*}" = "$n" ] && { echo "----- /readyz of $n -----" >&2; curl -s -m 3 "http://127.0.0.1:${sp##*:}/readyz" >&2 || true; echo >&2; }
        done
      fi
    done
    exit 1
  fi
  sleep 2
done
print_status
echo "==> all ready after $(($(date +%s) - start))s"
