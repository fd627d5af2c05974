#!/usr/bin/env bash
# The member clusters of the compose stack (east, west), in two steps `make compose-up` and
# `make compose-check` run:
#
#   compose-members.sh init       before `compose up`: each member's certificates, keys, admin
#                                 token and kubeconfig (pkg/cmd/devcluster init; kept if present)
#                                 and the kube bridge's hub's (devcluster init --kube-bridge)
#   compose-members.sh register   once the hub and the members' apiservers run:
#                                 0. the kube bridge's hub: its user bound to the hub chart's
#                                    ClusterRole (devcluster bootstrap-hub)
#                                 1. bootstrap: on each member, with its admin token, apply the
#                                    cluster-agent chart's ServiceAccount, least-privilege
#                                    ClusterRole (deploy/helm/cluster-agent/files/clusterrole-rules.yaml)
#                                    and binding, and write a token of that ServiceAccount where
#                                    the agent reads its in-cluster token
#                                 2. register: `fleetctl cluster register` each member through the
#                                    gateway and write the agent token it prints (shown only once)
#                                    into the directory the member's agent mounts at /run/secrets/nats
#                                 3. start the agents and wait until both clusters are Connected
#                                 4. wait until the kube bridge is ready
#
# Re-running `register` on a running stack keeps clusters that are registered and whose agent
# token is on disk; a cluster the registry lacks (a fresh stack) is registered anew.
#   FLEETSTREAM_COMPOSE_TIMEOUT  seconds to wait for each condition (default 120)
set -euo pipefail
source "$(dirname "$0")/compose-lib.sh"
timeout="${FLEETSTREAM_COMPOSE_TIMEOUT:-120}"
members=.data/compose/members
gw=http://127.0.0.1:18080

# The two host tools, built once per call (Go's build cache makes repeats cheap).
mkdir -p bin
(cd pkg && go build -o ../bin/devcluster ./cmd/devcluster)

case "${1:-}" in
init)
  for mp in $MEMBERS; do
    name=${mp%%:*} port=${mp##*:}
    bin/devcluster init --dir "$members/$name" --name "$name" --host-port "$port"
  done
  bin/devcluster init --dir .data/compose/${HUB%%:*} --name "${HUB%%:*}" --host-port "${HUB##*:}" --kube-bridge
  exit 0
  ;;
register) ;;
*)
  echo "usage: $0 init|register" >&2
  exit 2
  ;;
esac

go build -o bin/fleetctl ./services/fleetctl
export FLEETSTREAM_TOKEN FLEETSTREAM_SERVER=$gw
# The first line is dev-admin's (the second the kube bridge's user).
FLEETSTREAM_TOKEN=$(head -n1 .data/compose/api-tokens | cut -d, -f1)

# COMPOSE_WITHOUT (compose-start.sh) may leave the bridge and its hub out.
bridge=yes
case " ${COMPOSE_WITHOUT:-} " in *" kube-bridge "*) bridge=no;; esac

if [ $bridge = yes ]; then
  echo "==> the kube bridge's hub: its user bound to the hub chart's ClusterRole"
  bin/devcluster bootstrap-hub --dir .data/compose/${HUB%%:*} --rules deploy/helm/fleetstream/files/kube-bridge-clusterrole-rules.yaml \
    --timeout "${timeout}s" || { compose logs --no-color --tail=40 hub-apiserver hub-etcd >&2; exit 1; }
fi

echo "==> member clusters: the agent's identity is the chart's ClusterRole (a ServiceAccount token, not system:masters)"
for mp in $MEMBERS; do
  name=${mp%%:*}
  bin/devcluster bootstrap --dir "$members/$name" --rules deploy/helm/cluster-agent/files/clusterrole-rules.yaml \
    --timeout "${timeout}s" || { compose logs --no-color --tail=40 "$name-apiserver" "$name-etcd" >&2; exit 1; }
done

echo "==> register: fleetctl --server $gw cluster register, each agent's token into its volume"
fresh=()
for mp in $MEMBERS; do
  name=${mp%%:*}
  token=$members/$name/agent/token
  if [ -s "$token" ] && bin/fleetctl cluster get "$name" >/dev/null 2>&1; then
    echo "    $name: registered already"
    continue
  fi
  # Registered without a token on disk (it is shown only once): start over.
  bin/fleetctl cluster deregister "$name" >/dev/null 2>&1 || true
  out=$(bin/fleetctl cluster register "$name" --label env=dev --label region="$name" -o json 2>/dev/null) ||
    { echo "fleetctl cluster register $name failed" >&2; bin/fleetctl cluster register "$name" -o json >&2 || true; exit 1; }
  agent_token=$(printf '%s' "$out" | sed -n 's/.*"agentToken": *"\([^"]*\)".*/\1/p')
  [ -n "$agent_token" ] || { echo "no agent token in the answer of cluster register $name" >&2; exit 1; }
  # Replaced by rename: the agent mounts the directory, so it sees the new file.
  (umask 022 && printf '%s\n' "$agent_token" >"$token.tmp" && mv "$token.tmp" "$token")
  echo "    $name: registered, agent token in $token"
  fresh+=("$name-agent")
done

agents=""
for mp in $MEMBERS; do agents="$agents ${mp%%:*}-agent"; done
# An agent already running with the token of an earlier registration must restart to read the new one.
running=" $(compose ps --services --filter status=running 2>/dev/null | tr '\n' ' ') "
restart=()
for a in "${fresh[@]}"; do case "$running" in *" $a "*) restart+=("$a") ;; esac; done
echo "==> starting the agents:$agents"
compose up -d $agents 2>&1 | grep -v -e 'is up-to-date' -e '^Creating' -e '^Starting' || true
[ ${#restart[@]} = 0 ] || compose restart "${restart[@]}" >/dev/null 2>&1

# Output captured before grep: `grep -q` stops reading early, and pipefail would take the writer's SIGPIPE for a failure.
connected() { local out; out=$(bin/fleetctl cluster get "$1" -o json 2>/dev/null | tr -d ' \n') && grep -q '"type":"AgentConnected","status":"CONDITION_STATUS_TRUE"' <<<"$out"; }
start=$(date +%s)
for mp in $MEMBERS; do
  name=${mp%%:*}
  until connected "$name"; do
    if [ $(($(date +%s) - start)) -ge "$timeout" ]; then
      echo "cluster $name is not Connected after ${timeout}s" >&2
      bin/fleetctl cluster get "$name" -o yaml >&2 || true
      compose logs --no-color --tail=60 "$name-agent" >&2 || true
      exit 1
    fi
    sleep 1
  done
done
bin/fleetctl cluster list
echo "==> every member cluster is Connected after $(($(date +%s) - start))s"

if [ $bridge = no ]; then
  echo "==> kube-bridge not started (COMPOSE_WITHOUT)"
  exit 0
fi
# The bridge retried the hub (backoff up to 30 s) while its ClusterRole was missing.
bridge_ready() { [ "$(curl -s -o /dev/null -m 3 -w '%{http_code}' "http://127.0.0.1:$KUBE_BRIDGE_PORT/readyz" 2>/dev/null || true)" = 200 ]; }
start=$(date +%s)
until bridge_ready; do
  if [ $(($(date +%s) - start)) -ge "$timeout" ]; then
    echo "kube-bridge is not ready after ${timeout}s" >&2
    curl -s -m 3 "http://127.0.0.1:$KUBE_BRIDGE_PORT/readyz" >&2 || true
    compose logs --no-color --tail=60 kube-bridge >&2 || true
    exit 1
  fi
  sleep 1
done
echo "==> kube-bridge is ready (hub admin kubeconfig: .data/compose/${HUB%%:*}/admin.kubeconfig)"
