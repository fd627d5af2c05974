# Shared by the compose scripts (sourced, not run).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ -z "${COMPOSE:-}" ]; then
  if command -v docker-compose >/dev/null 2>&1; then COMPOSE=docker-compose; else COMPOSE="docker compose"; fi
fi
# service:host-port of every hub service and the gateway in docker-compose.yml (the gateway's
# /readyz is 200 only when it reaches every service). Override to run a subset, e.g.
# FLEETSTREAM_COMPOSE_SERVICES="cluster-import:18081 rbac-sync:18083" (without the gateway: it
# routes to all four services, so it is never ready with fewer).
SERVICES="${FLEETSTREAM_COMPOSE_SERVICES:-cluster-import:18081 namespace-binding:18082 rbac-sync:18083 endpoint-collector:18084 gateway:18080}"
# NATS nodes and their published monitoring ports.
NATS_NODES="nats-1:18222 nats-2:18223 nats-3:18224"
compose() { $COMPOSE "$@"; }
# name:host-port of each member cluster's kube-apiserver (tools/scripts/compose-members.sh).
MEMBERS="east:16443 west:16444"
# name:host-port of the kube bridge's hub kube-apiserver (no agent; docker-compose.yml says why
# it is not a member), and the bridge's published port.
HUB="hub:16445"
KUBE_BRIDGE_PORT=18085
