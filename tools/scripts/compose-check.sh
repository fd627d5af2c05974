#!/usr/bin/env bash
# CI check of the local stack: start docker-compose.yml (images and bin/kubectl must exist: `make
# compose-check` builds them), wait for every NATS node, service and the gateway to be ready,
# register the member clusters and wait until they are Connected, run the demo
# (tools/scripts/demo.sh, `make demo`), check the kube bridge published the members as
# ClusterProfiles on its hub apiserver, smoke-test the API through the gateway (the stack's one
# API port, 18080) with the dev bearer token, and ALWAYS tear down (`down -v`), pass or fail.
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
if [ -z "${FLEETSTREAM_COMPOSE_SERVICES:-}" ]; then
  # The whole stack as `make compose-up` starts it (hosted-agent included): the member clusters
  # registered and Connected, then the demo, exactly as a newcomer runs it (make demo).
  tools/scripts/compose-members.sh init
  tools/scripts/compose-start.sh
  echo "==> make demo"
  t0=$(date +%s)
  tools/scripts/demo.sh || { echo "the demo failed" >&2; compose logs --no-color --tail=40 east-agent west-agent >&2; exit 1; }
  echo "==> the demo passed in $(($(date +%s) - t0))s"
  # The kube bridge publishes the fleet to its hub apiserver: a ClusterProfile per member.
  echo "==> smoke test: the kube bridge's hub has the ClusterProfiles of east and west"
  hubkc=.data/compose/hub/admin.kubeconfig
  t0=$(date +%s)
  until "${KUBECTL:-bin/kubectl}" --kubeconfig "$hubkc" get clusterprofiles.multicluster.x-k8s.io -n fleetstream-system east west >/dev/null 2>&1; do
    if [ $(($(date +%s) - t0)) -ge 60 ]; then
      echo "no ClusterProfiles east and west on the hub after 60s" >&2
      "${KUBECTL:-bin/kubectl}" --kubeconfig "$hubkc" get clusterprofiles.multicluster.x-k8s.io -A >&2 || true
      compose logs --no-color --tail=60 kube-bridge >&2 || true
      exit 1
    fi
    sleep 1
  done
  "${KUBECTL:-bin/kubectl}" --kubeconfig "$hubkc" get clusterprofiles.multicluster.x-k8s.io -n fleetstream-system
else
  # hosted-agent serves no port (it is not in SERVICES); it comes with cluster-import.
  case " $names " in *" cluster-import "*) names="$names hosted-agent" ;; esac
  echo "==> starting nats-1 nats-2 nats-3$names"
  compose up -d nats-1 nats-2 nats-3 $names
  tools/scripts/compose-wait.sh
fi

# Smoke test through the gateway, the API port clients use.
gw=http://127.0.0.1:18080
token=$(head -n1 .data/compose/api-tokens | cut -d, -f1)
case " $names " in
*" gateway "*)
  echo "==> smoke test: the gateway refuses an unauthenticated call (401) and an unknown service (404)"
  code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' -d '{}' "$gw/fleetstream.cluster.v1.ClusterService/ListClusters")
  [ "$code" = 401 ] || { echo "want 401 without a token, got $code" >&2; exit 1; }
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d '{}' "$gw/fleetstream.nope.v1.NopeService/List")
  [ "$code" = 404 ] || { echo "want 404 for an unknown service, got $code" >&2; exit 1; }
  echo "==> smoke test: the gateway reaches every service"
  for p in fleetstream.cluster.v1.ClusterService/ListClusters fleetstream.cluster.v1.SubscriberService/ListSubscribers \
    fleetstream.cluster.v1.ImportPolicyService/ListImportPolicies fleetstream.project.v1.ProjectService/ListProjects \
    fleetstream.placement.v1.ClusterSetService/ListClusterSets fleetstream.placement.v1.PlacementService/ListPlacements \
    fleetstream.rbac.v1.RBACService/ListRoleTemplates fleetstream.audit.v1.AuditService/ListActivity \
    fleetstream.endpoint.v1.EndpointService/ListServices; do
    out=$(curl -sS -D - -o /dev/null -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -d '{}' "$gw/$p") ||
      { echo "$p through the gateway failed" >&2; exit 1; }
    case "$out" in
    "HTTP/1.1 200"*) ;;
    *) echo "$p through the gateway: $(printf '%s' "$out" | head -1)" >&2; compose logs --no-color --tail=40 gateway >&2; exit 1 ;;
    esac
    case "$out" in
    *[Xx]-[Rr]equest-[Ii]d:*) ;;
    *) echo "$p through the gateway: no X-Request-Id in the response" >&2; exit 1 ;;
    esac
    echo "    $p: 200"
  done
  echo "==> smoke test: fleetctl --server $gw project create team-a (as in the README)"
  fleetctl=$(mktemp -d)/fleetctl
  go build -o "$fleetctl" ./services/fleetctl
  FLEETSTREAM_TOKEN="$token" "$fleetctl" --server "$gw" project create team-a ||
    { echo "fleetctl project create through the gateway failed" >&2; compose logs --no-color --tail=40 gateway namespace-binding >&2; exit 1; }
  FLEETSTREAM_TOKEN="$token" "$fleetctl" --server "$gw" project get team-a >/dev/null ||
    { echo "fleetctl project get through the gateway failed" >&2; exit 1; }
  rm -rf "$(dirname "$fleetctl")"
  ;;
esac
case " $names " in
*" cluster-import "*" gateway "*)
  url=$gw/fleetstream.cluster.v1.ClusterService
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
# Least privilege must still be enough: no service may have been refused anything it tried.
echo "==> no NATS permission violations by the services"
if violations=$(compose logs --no-color nats-1 nats-2 nats-3 2>&1 | grep -E 'Publish Violation|Subscription Violation|Permissions Violation'); then
  printf '%s\n' "$violations" | tail -20 >&2
  echo "a service was refused on NATS: its row in pkg/natsauth/permissions.go is missing something" >&2
  exit 1
fi
# NATS isolation on the three-node cluster: the auth callout (answered by cluster-import) confines
# an agent of c1 to c1 and refuses unknown tokens (pkg/natsauth/compose_check_test.go).
case " $names " in
*" cluster-import "*" gateway "*)
  echo "==> NATS isolation: register c1 (with credentials) and c2, then connect as c1's agent"
  reg=$(curl -sS -f -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -d '{"name":"c1","credentials":{"server":"https://c1.example:6443","token":"compose-check-secret"}}' "$url/RegisterCluster") ||
    { echo "RegisterCluster c1 failed" >&2; exit 1; }
  curl -sS -f -o /dev/null -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -d '{"name":"c2","credentials":{"server":"https://c2.example:6443","token":"compose-check-secret-2"}}' "$url/RegisterCluster" ||
    { echo "RegisterCluster c2 failed" >&2; exit 1; }
  agent_token=$(printf '%s' "$reg" | grep -o '"agentToken": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/')
  [ -n "$agent_token" ] || { echo "no agent token in the RegisterCluster answer" >&2; exit 1; }
  (cd pkg && FLEETSTREAM_COMPOSE_NATS_URL=nats://127.0.0.1:14222 FLEETSTREAM_COMPOSE_AGENT_TOKEN="$agent_token" \
    FLEETSTREAM_COMPOSE_SERVICE_TOKEN_FILE="$PWD/../.data/compose/nats/namespace-binding.token" \
    go test -tags composecheck -count=1 -run TestComposeIsolation -v ./natsauth/ 2>&1 |
    grep -E '^(=== RUN|--- |\s+---|ok|FAIL|PASS)|_test.go') ||
    { echo "NATS isolation check failed" >&2; compose logs --no-color --tail=80 cluster-import >&2; exit 1; }
  # c1 and c2 have credentials and no agent: the hosted-agent container fetches them from
  # cluster-import and connects to NATS as each cluster's agent (their fake apiservers never
  # answer, so neither heartbeats).
  echo "==> hosted agents: c1 and c2 connected to NATS as their clusters' agents"
  deadline=$((SECONDS + 60))
  until [ "$(compose logs --no-color hosted-agent 2>&1 | grep 'connected to NATS as the cluster' | grep -cE '"cluster": ?"c[12]"')" -ge 2 ]; do
    [ $SECONDS -lt $deadline ] || { echo "hosted agents did not connect" >&2; compose logs --no-color --tail=60 hosted-agent >&2; exit 1; }
    sleep 1
  done
  # Only the agents' own refusals count: the isolation check's probes above are refused on
  # purpose (its clients are unnamed; agents name theirs cluster-agent/<c> and
  # cluster-agent-hosted/<c>, the supervisor hosted-agent).
  if violations=$(compose logs --no-color nats-1 nats-2 nats-3 2>&1 | grep -E 'Publish Violation|Subscription Violation|Permissions Violation' |
    grep -E ':go:(cluster-agent|hosted)'); then
    printf '%s\n' "$violations" | tail -20 >&2
    echo "an agent was refused on NATS: check pkg/natsauth/permissions.go" >&2
    exit 1
  fi
  ;;
esac
# Every stream (and KV bucket) the services created must be replicated on all three nodes.
echo "==> every JetStream stream has 3 replicas"
jsz=$(curl -sS -f 'http://127.0.0.1:18222/jsz?streams=true&config=true')
replicas=$(printf '%s' "$jsz" | grep -o '"num_replicas": *[0-9]*' | grep -o '[0-9]*$' | sort | uniq -c || true)
echo "${replicas:-    (no streams)}" | sed 's/^ */    streams: /; s/ \([0-9]*\)$/ with replicas=\1/'
if grep -q '"num_replicas": *[0-24-9]' <<<"$jsz"; then
  echo "some streams are not R3: is --replicas honoured?" >&2; exit 1
fi
echo "==> compose check passed"
