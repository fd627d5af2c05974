#!/usr/bin/env bash
# make chart-check: the Helm charts of deploy/helm install. Lints both, renders each with its
# default values and with its values-production.yaml (the hub also with its monitoring objects),
# checks the agent chart refuses to render without the values it cannot guess, then applies every
# rendered object with a server-side dry run (strict field validation; the prometheus-operator
# CRDs installed for the monitoring render) to a real kube-apiserver of the test kit, parses the
# hub's rendered NATS config with nats-server, and runs the agent as the chart's ClusterRole
# (services/cluster-agent/charttest). Needs only Go: helm comes from bin/ (make helm), the
# apiserver from tools/build-test-assets.sh; no kubectl.
set -euo pipefail
cd "$(dirname "$0")/../.."
helm=${HELM:-bin/helm}
hub=deploy/helm/fleetstream
agent=deploy/helm/cluster-agent
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The hub with its Prometheus Operator objects (ServiceMonitor, PrometheusRule): the dry run
# installs the operator's CRDs first (charttest/testdata/prometheus-operator-crds).
hub_monitoring=(--set monitoring.serviceMonitor.enabled=true --set monitoring.prometheusRule.enabled=true
  --set-json 'monitoring.labels={"release":"kube-prometheus-stack"}')
# The hub with the kube bridge (off by default), on this cluster as the hub (its ClusterRole) and
# on another hub's kubeconfig (no rights here).
hub_bridge=(--set kubeBridge.enabled=true --set kubeBridge.apiTokenSecret=fleetstream-kube-bridge-api
  --set kubeBridge.projectsTokenSecret=fleetstream-kube-bridge-projects)
# What every agent install must say: which cluster it is and where the hub's NATS is.
agent_required=(--set cluster=c1 --set nats.url=nats://nats.hub.example.com:4222)

echo "==> helm lint"
"$helm" lint --strict "$hub"
"$helm" lint --strict "$hub" -f "$hub/values-production.yaml"
"$helm" lint --strict "$hub" "${hub_monitoring[@]}"
"$helm" lint --strict "$hub" "${hub_bridge[@]}"
"$helm" lint --strict "$agent" "${agent_required[@]}"
"$helm" lint --strict "$agent" -f "$agent/values-production.yaml"

echo "==> helm template (default, production, monitoring and kube bridge values)"
"$helm" template fleetstream "$hub" --namespace fleetstream >"$out/hub-default.yaml"
"$helm" template fleetstream "$hub" --namespace fleetstream -f "$hub/values-production.yaml" >"$out/hub-production.yaml"
"$helm" template fleetstream "$hub" --namespace fleetstream "${hub_monitoring[@]}" >"$out/hub-monitoring.yaml"
"$helm" template fleetstream "$hub" --namespace fleetstream "${hub_bridge[@]}" >"$out/hub-kube-bridge.yaml"
"$helm" template fleetstream "$hub" --namespace fleetstream "${hub_bridge[@]}" \
  --set kubeBridge.hubKubeconfigSecret=fleetstream-kube-bridge-hub >"$out/hub-kube-bridge-external.yaml"
"$helm" template fleetstream "$agent" --namespace fleetstream-agent "${agent_required[@]}" >"$out/agent-default.yaml"
"$helm" template fleetstream "$agent" --namespace fleetstream-agent -f "$agent/values-production.yaml" >"$out/agent-production.yaml"
for missing in cluster nats.url; do
  args=("${agent_required[@]}")
  for i in "${!args[@]}"; do [[ ${args[$i]} == "$missing="* ]] && args[$i]="$missing="; done
  if "$helm" template fleetstream "$agent" "${args[@]}" >/dev/null 2>&1; then
    echo "the cluster-agent chart rendered without $missing" >&2
    exit 1
  fi
done
echo "    the cluster-agent chart refuses to render without cluster or nats.url"
wc -l "$out"/*.yaml | sed 's/^/    /'

assets=$(tools/build-test-assets.sh)
echo "==> server-side dry run of every rendered object (kube-apiserver from $assets)"
cd services/cluster-agent
FLEETSTREAM_CHART_MANIFESTS="$out" KUBEBUILDER_ASSETS="$assets" \
  go test -count=1 -run '^TestChartsDryRun$' -v ./charttest | grep -v -E '^=== (RUN|PAUSE|CONT|NAME)'
echo "==> the agent's least privilege: every function as the chart's ClusterRole, no Secrets"
KUBEBUILDER_ASSETS="$assets" go test -count=1 -run '^TestAgentWithChartClusterRole$' ./charttest
