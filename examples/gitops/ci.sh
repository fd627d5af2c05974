#!/usr/bin/env bash
# The CI job of a fleet repository laid out as this one (manifests/ under the repository root).
#
#   ci.sh pr      on a pull request: print what merging it would change (fleetctl diff), and
#                 fail only on an error: exit 1 of diff means "there are changes", the
#                 reviewer's business.
#   ci.sh merge   on a merge to the main branch: apply the manifests, deleting what the
#                 repository no longer declares (--prune of the apply set "gitops"); the agent
#                 tokens of new clusters go to $TOKEN_DIR, never to the job's log.
#
# fleetctl reads its server and token from FLEETSTREAM_SERVER and FLEETSTREAM_TOKEN (or
# FLEETSTREAM_TOKEN_FILE), the CI system's secrets; FLEETCTL names the binary.
set -euo pipefail
manifests=$(dirname "$0")/manifests
fleetctl=${FLEETCTL:-fleetctl}
applyset=${APPLYSET:-gitops}

case "${1:-}" in
pr)
	status=0
	"$fleetctl" diff -f "$manifests" --applyset "$applyset" --prune || status=$?
	case $status in
	0) echo "no change: the fleet is as declared" ;;
	1) echo "merging changes the fleet as shown" ;;
	*) exit "$status" ;;
	esac
	;;
merge)
	"$fleetctl" apply -f "$manifests" --applyset "$applyset" --prune --cascade --token-dir "${TOKEN_DIR:-agent-tokens}"
	;;
*)
	echo "usage: $0 pr|merge" >&2
	exit 2
	;;
esac
