#!/usr/bin/env bash
# The CI job of a fleet repository laid out as this one (manifests/ under the repository root).
#
#   ci.sh pr      on a pull request: print what merging it would change (fleetctl diff), and
#                 fail only on an error: exit 1 of diff means "there are changes", the
#                 reviewer's business. A field someone changed outside the repository since
#                 the last merge is a conflict (exit 2): merging would overwrite their change.
#                 So is a change the API cannot make (a project's display name, a subscriber's
#                 streams): the merge's apply would refuse it.
#   ci.sh merge   on a merge to the main branch: apply the manifests, deleting what the
#                 repository no longer declares (--prune of the apply set "gitops"); the agent
#                 tokens of new clusters go to $TOKEN_DIR, never to the job's log. A conflict
#                 fails it, changing nothing: put the live value into the manifests, or rerun
#                 with FORCE_CONFLICTS=1 to take the field back.
#
# APPLYSET_RECORDS is a directory the CI system keeps between jobs (a cache): fleetctl records
# there what the apply set last applied, which is how it tells the repository's changes from
# changes made outside it (docs/fleet-as-code.md, "Field ownership and conflicts"). Without it,
# fleetctl keeps the record beside its configuration file, which a fresh runner does not have.
#
# fleetctl reads its server and token from FLEETSTREAM_SERVER and FLEETSTREAM_TOKEN (or
# FLEETSTREAM_TOKEN_FILE), the CI system's secrets; FLEETCTL names the binary.
set -euo pipefail
manifests=$(dirname "$0")/manifests
fleetctl=${FLEETCTL:-fleetctl}
applyset=${APPLYSET:-gitops}
owned=(--applyset "$applyset")
[ -n "${APPLYSET_RECORDS:-}" ] && owned+=(--applyset-records "$APPLYSET_RECORDS")
[ -n "${FORCE_CONFLICTS:-}" ] && owned+=(--force-conflicts)

case "${1:-}" in
pr)
	status=0
	"$fleetctl" diff -f "$manifests" "${owned[@]}" --prune || status=$?
	case $status in
	0) echo "no change: the fleet is as declared" ;;
	1) echo "merging changes the fleet as shown" ;;
	*) exit "$status" ;;
	esac
	;;
merge)
	"$fleetctl" apply -f "$manifests" "${owned[@]}" --prune --cascade --token-dir "${TOKEN_DIR:-agent-tokens}"
	;;
*)
	echo "usage: $0 pr|merge" >&2
	exit 2
	;;
esac
