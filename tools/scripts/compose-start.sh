#!/usr/bin/env bash
# Starts the whole compose stack in order (`make compose-up`, `make compose-check`): NATS, the hub
# services, the gateway and the member clusters' etcd and kube-apiserver; waits until NATS and
# every /readyz answer; then registers the member clusters and starts their agents, which need
# the agent tokens registration prints (compose-members.sh register). Images and secrets must
# exist (make images compose-secrets).
set -euo pipefail
source "$(dirname "$0")/compose-lib.sh"
agents=""
for mp in $MEMBERS; do agents="$agents ${mp%%:*}-agent"; done
# COMPOSE_WITHOUT: services not to start at all (the rolling upgrade leaves out what N−1 lacks).
rest=$(compose config --services | grep -v -x -F -f <(printf '%s\n' $agents ${COMPOSE_WITHOUT:-}) | tr '\n' ' ')
echo "==> starting $rest"
compose up -d $rest
tools/scripts/compose-wait.sh
tools/scripts/compose-members.sh register
