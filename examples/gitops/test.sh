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
# The apply set's record stays where fleetctl keeps it by default (beside its configuration, per
# server), as on a machine that applies by hand: an `apply --applyset gitops` after this script
# finds it. APPLYSET_RECORDS, when set, is the CI cache's directory instead.

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
# Output is captured before grep: `grep -q` stops reading at the first match, and under pipefail
# the writer's SIGPIPE would then fail a check that passed.
out=$("$FLEETCTL" export --kind Project)
grep -q 'name: team-b' <<<"$out" && fail "team-b still exported"

# A quota changed by hand since the merge: the next pull request and merge name the conflict and
# change nothing; once the live value is the declared one again, the merge goes through.
"$FLEETCTL" namespace quota web --project team-a --cluster eu-1 --hard cpu=3 --hard memory=4Gi >/dev/null
status=0
out=$("$repo/ci.sh" pr 2>&1) || status=$?
[ "$status" = 2 ] && grep -q 'spec.hard.cpu: changed by another writer .* since this apply set last applied it; live "3", manifest "2"' <<<"$out" ||
	fail "a change made by hand is no conflict for the pull request (exit $status): $out"
status=0
out=$("$repo/ci.sh" merge 2>&1) || status=$?
[ "$status" = 1 ] && grep -q -- '--force-conflicts' <<<"$out" || fail "the merge over a change made by hand did not stop (exit $status): $out"
out=$("$FLEETCTL" export --kind NamespaceBinding)
grep -q 'cpu: "3"' <<<"$out" || fail "the refused merge changed the quota: $out"
out=$(FORCE_CONFLICTS=1 "$repo/ci.sh" merge 2>/dev/null)
grep -q '^NamespaceBinding/team-a/cluster=eu-1/web configured$' <<<"$out" || fail "FORCE_CONFLICTS=1 did not take the quota back: $out"

# The cache of records lost (evicted) while the fleet holds the set's objects, and a quota
# changed by hand meanwhile: the pull request and the merge stop, changing nothing, instead of
# overwriting it; FORCE_CONFLICTS=1 takes every field over and records the set again.
"$FLEETCTL" namespace quota web --project team-a --cluster eu-1 --hard cpu=3 --hard memory=4Gi >/dev/null
export APPLYSET_RECORDS=$repo/evicted-cache # a runner whose cache is empty
status=0
out=$("$repo/ci.sh" pr 2>&1) || status=$?
[ "$status" = 2 ] && grep -q 'apply set gitops has no record of what it applied .*, yet .* carry its label' <<<"$out" ||
	fail "a lost record is no error for the pull request (exit $status): $out"
status=0
out=$("$repo/ci.sh" merge 2>&1) || status=$?
[ "$status" = 1 ] && grep -q -- '--force-conflicts' <<<"$out" || fail "the merge without the record did not stop (exit $status): $out"
out=$("$FLEETCTL" export --kind NamespaceBinding)
grep -q 'cpu: "3"' <<<"$out" || fail "the merge without the record changed the quota: $out"
out=$(FORCE_CONFLICTS=1 "$repo/ci.sh" merge 2>/dev/null)
grep -q '^NamespaceBinding/team-a/cluster=eu-1/web configured$' <<<"$out" || fail "FORCE_CONFLICTS=1 without the record did not take the quota back: $out"
[ -s "$APPLYSET_RECORDS/gitops.json" ] || fail "FORCE_CONFLICTS=1 did not record the set again"

# A pull request renaming team-a: the API cannot change a project's display name, so the pull
# request fails (exit 2) rather than its merge.
project=$repo/manifests/projects/team-a/project.yaml
cp "$project" "$repo/project.yaml.orig"
sed 's/displayName: Team A/displayName: Team Alpha/' "$repo/project.yaml.orig" >"$project"
status=0
out=$("$repo/ci.sh" pr 2>&1) || status=$?
[ "$status" = 2 ] && grep -q "Project/team-a: spec.displayName: a project's display name cannot be changed" <<<"$out" ||
	fail "a change the API cannot make passes the pull request (exit $status): $out"
cp "$repo/project.yaml.orig" "$project"
echo "gitops example: ok"
