#!/usr/bin/env bash
# Runs the CI job against a fleet (FLEETSTREAM_SERVER and a token in the environment) as a
# repository's history would: a pull request and its merge, an unchanged rerun, then a pull
# request that removes team-b and its merge. The fleet should be empty, or hold nothing of the
# apply set "gitops" yet. FLEETCTL names the fleetctl binary (default: fleetctl on PATH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
FLEETCTL=${FLEETCTL:-fleetctl}
case $FLEETCTL in */*) FLEETCTL=$(cd "$(dirname "$FLEETCTL")" && pwd)/$(basename "$FLEETCTL") ;; esac
export FLEETCTL
repo=$(mktemp -d)
trap 'rm -rf "$repo"' EXIT
cp -R "$here/." "$repo"
export TOKEN_DIR=$repo/agent-tokens

fail() { echo "test.sh: $*" >&2; exit 1; }

out=$("$repo/ci.sh" pr)
grep -q '^+++ declared/Project/team-a$' <<<"$out" || fail "the first pull request does not show team-a: $out"
"$repo/ci.sh" merge
[ -s "$TOKEN_DIR/eu-1.token" ] || fail "no agent token for eu-1"
out=$("$repo/ci.sh" pr)
[ "$out" = "no change: the fleet is as declared" ] || fail "after the merge: $out"
out=$("$repo/ci.sh" merge)
[ "$(grep -cv ' unchanged$' <<<"$out")" = 0 ] || fail "a second merge changed something: $out"

# A pull request removing team-b: the diff shows its deletion, the merge prunes it.
rm -r "$repo/manifests/projects/team-b"
out=$("$repo/ci.sh" pr)
grep -q '^--- live/Project/team-b$' <<<"$out" || fail "removing team-b does not show: $out"
out=$("$repo/ci.sh" merge)
grep -q '^Project/team-b pruned$' <<<"$out" || fail "team-b not pruned: $out"
"$FLEETCTL" export --kind Project | grep -q 'name: team-b' && fail "team-b still exported"
echo "gitops example: ok"
