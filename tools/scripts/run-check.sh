#!/usr/bin/env bash
# Checks the README's first command: starts `make run` in the background (in a scratch data dir
# and on spare ports, so it never touches a developer's .data or running fleetd), waits until
# `bin/fleetctl cluster list` answers with the generated token, and stops it again.
#   RUN_CHECK_TIMEOUT  seconds from `make run` to a fleetctl answer (default 60). The binaries are
#                      built first, outside that time: on a loaded machine the link alone took
#                      longer than the start it is meant to bound.
set -euo pipefail
cd "$(dirname "$0")/../.."
timeout="${RUN_CHECK_TIMEOUT:-60}"
data=$(mktemp -d)
listen=127.0.0.1:18080
log="$data/run.log"
pid=""
cleanup() {
  local rc=$?
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -INT -- "-$pid" 2>/dev/null || kill -INT "$pid" || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  if [ $rc != 0 ]; then echo "----- make run output -----" >&2; tail -n 60 "$log" >&2 || true; fi
  rm -rf "$data"
  exit $rc
}
trap cleanup EXIT

echo "==> make build"
make build >/dev/null
start=$(date +%s)
# Own process group (setsid), so cleanup stops make and fleetd together, and nothing else.
setsid make run DATA="$data" LISTEN="$listen" FLEETD_ARGS="--nats-listen 127.0.0.1:14299 --xds-listen 127.0.0.1:18299" >"$log" 2>&1 &
pid=$!
echo "==> make run (pid $pid), waiting up to ${timeout}s for bin/fleetctl cluster list"
until out=$(FLEETSTREAM_TOKEN_FILE="$data/tokens" bin/fleetctl --server "http://$listen" --timeout 2s cluster list 2>&1); do
  kill -0 "$pid" 2>/dev/null || { echo "make run exited" >&2; exit 1; }
  if [ $(($(date +%s) - start)) -ge "$timeout" ]; then echo "no answer after ${timeout}s: $out" >&2; exit 1; fi
  sleep 1
done
echo "    answered after $(($(date +%s) - start))s: ${out:-<empty>}"
echo "==> without a token the API refuses"
if bin/fleetctl --server "http://$listen" --timeout 2s cluster list >/dev/null 2>&1; then
  echo "fleetctl without a token succeeded: make run must use the token file" >&2; exit 1
fi
echo "==> the README's project-owner commands work as dev-admin"
fc() { FLEETSTREAM_TOKEN_FILE="$data/tokens" bin/fleetctl --server "http://$listen" --timeout 10s "$@"; }
fc project create team-a >/dev/null
fc member add team-a --user alice --role project-owner >/dev/null
members=$(fc member list team-a) # not piped into grep -q: its early exit is a SIGPIPE under pipefail
grep -q alice <<<"$members" || { echo "alice is not a member of team-a: $members" >&2; exit 1; }
echo "==> make run check passed"
