#!/usr/bin/env bash
# make upgrade-check: the rolling upgrade on the compose stack (issue 31). Builds N−1's images
# (the commit in deploy/upgrade/previous-release, checked out in a git worktree under
# .data/previous) as fleetstream/<name>:previous, starts the chaos profile's stack (three NATS
# nodes, two replicas of every hub service) on them, then runs tools/chaos TestRollingUpgrade:
# under the steady write load, every hub service's replicas are replaced one at a time by this
# tree's images (fleetstream/<name>:latest, which `make images` built), the gateway and the hosted
# agents after them, the members' agents last; checked for lost acknowledged writes and views
# that differ from a rebuild, with the agents one version behind a hub on N still applying.
# Writes the figures to .data/upgrade-report.md and ALWAYS tears down.
#
# NATS, etcd and kube-apiserver are not Fleetstream's: their N images are tagged :previous too
# (NATS is upgraded on its own, docs/operations.md).
#   UPGRADE_PREVIOUS=<commit>   another N−1 than the pinned one
set -euo pipefail
source "$(dirname "$0")/compose-lib.sh"
COMPOSE="$COMPOSE -f docker-compose.yml -f deploy/chaos/docker-compose.yml"
export COMPOSE
root=$PWD
report=$root/.data/upgrade-report.md
previous=${UPGRADE_PREVIOUS:-$(grep -v '^#' deploy/upgrade/previous-release | tr -d '[:space:]')}
ours="cluster-import namespace-binding rbac-sync endpoint-collector cluster-agent gateway"

git cat-file -e "$previous^{commit}" 2>/dev/null ||
  { echo "N−1 commit $previous is not in this clone (a shallow clone? git fetch --unshallow)" >&2; exit 1; }
git merge-base --is-ancestor "$previous" HEAD ||
  { echo "N−1 commit $previous is not an ancestor of HEAD: deploy/upgrade/previous-release must name a commit of this branch's history" >&2; exit 1; }

echo "==> N−1 images from $previous (fleetstream/<name>:previous)"
src=$root/.data/previous/src
t0=$(date +%s)
if [ "$(git -C "$src" rev-parse HEAD 2>/dev/null || true)" != "$(git rev-parse "$previous")" ]; then
  rm -rf "$src"
  git worktree prune
  git worktree add --detach --force "$src" "$previous" >/dev/null
fi
for name in $ours; do make -s -C "$src" "image-$name" IMAGE_TAG=previous; done
built=$(($(date +%s) - t0))
for name in nats etcd kube-apiserver; do docker tag "fleetstream/$name:latest" "fleetstream/$name:previous"; done
echo "==> N−1 images built in ${built}s"
previous_version=$(git -C "$src" describe --always --dirty)
current_version=$(git describe --always --dirty)

# compose down stops at a network it cannot remove, before the volumes: the next run would start
# on this run's NATS data. The project's volumes go in any case.
down() {
  compose down -v --remove-orphans >/dev/null 2>&1 || compose down -v --remove-orphans || true
  local project vols
  project=$(compose config 2>/dev/null | sed -n 's/^name: *//p')
  project=${project:-${COMPOSE_PROJECT_NAME:-$(basename "$root" | tr 'A-Z' 'a-z' | tr -cd 'a-z0-9_-')}}
  vols=$(docker volume ls -q --filter "label=com.docker.compose.project=$project")
  [ -z "$vols" ] || docker volume rm $vols >/dev/null
}

teardown() {
  local rc=$?
  if [ $rc != 0 ]; then
    echo "==> upgrade failed; the last lines of every container's log:" >&2
    compose logs --no-color --tail=30 >&2 || true
  fi
  echo "==> tearing down"
  down
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT TERM

tools/scripts/dev-secrets.sh
down
tools/scripts/compose-members.sh init
echo "==> starting the stack on N−1 ($previous_version)"
# The kube bridge and its hub apiserver are left out: N−1's NATS permissions (cluster-import's
# auth callout) do not let the bridge hold its lease, so it never turns ready on an N−1 hub; the
# bridge's own upgrade is tested once N−1 has one that holds a lease.
FLEETSTREAM_IMAGE_TAG=previous COMPOSE_WITHOUT="kube-bridge hub-apiserver hub-etcd" tools/scripts/compose-start.sh
echo "==> rolling upgrade to N ($current_version) (tools/chaos TestRollingUpgrade)"
rm -f "$report"
(cd tools/chaos && FLEETSTREAM_ROOT="$root" FLEETSTREAM_COMPOSE="$COMPOSE" FLEETSTREAM_UPGRADE_REPORT="$report" \
  FLEETSTREAM_PREVIOUS_VERSION="$previous_version" FLEETSTREAM_CURRENT_VERSION="$current_version" \
  FLEETSTREAM_N1_BUILD_SECONDS="$built" \
  go test -tags chaos -count=1 -v -timeout 30m -run TestRollingUpgrade .)
echo "==> figures ($report):"
cat "$report"
