#!/usr/bin/env bash
# make demo: a narrated walkthrough of Fleetstream against the running compose stack
# (`make compose-up`: the hub behind the gateway on 127.0.0.1:18080, member clusters east and
# west with their agents Connected). Every command is printed before it runs, as you would type
# it; every expectation is checked, waiting for it with a deadline where the fleet converges
# asynchronously, and the first one that fails ends the demo with exit 1. CI runs it (make
# compose-check).
#
# At the end the demo puts the fleet back as it found it, so it can run again.
#   KUBECTL                      kubectl to use (make demo passes bin/kubectl, built pinned)
#   FLEETSTREAM_DEMO_TIMEOUT     seconds to wait for each converging expectation (default 60)
set -euo pipefail
cd "$(dirname "$0")/../.."
timeout="${FLEETSTREAM_DEMO_TIMEOUT:-60}"
members=.data/compose/members

if [ -t 1 ]; then B=$'\e[1m' D=$'\e[2m' G=$'\e[32m' R=$'\e[31m' N=$'\e[0m'; else B='' D='' G='' R='' N=''; fi

# What the commands below need, set up as a user of the stack would.
mkdir -p bin
go build -o bin/fleetctl ./services/fleetctl
kubectl_bin=${KUBECTL:-bin/kubectl}
[ -x "$kubectl_bin" ] || { echo "no kubectl at $kubectl_bin: run make demo (it builds bin/kubectl)" >&2; exit 1; }
# `kubectl` and `fleetctl` below are these binaries, so the printed commands read as typed.
kubectl() { "$kubectl_bin" "$@"; }
fleetctl() { bin/fleetctl "$@"; }
export FLEETSTREAM_SERVER=http://127.0.0.1:18080 FLEETSTREAM_TOKEN_FILE=.data/compose/api-tokens
export KUBECONFIG=$members/east/admin.kubeconfig:$members/west/admin.kubeconfig
[ -s "$FLEETSTREAM_TOKEN_FILE" ] && [ -s "$members/east/admin.kubeconfig" ] ||
  { echo "the compose stack's files are missing: run make compose-up first" >&2; exit 1; }

step=0
chapter() {
  step=$((step + 1))
  printf '\n%s%d. %s%s\n' "$B" "$step" "$1" "$N"
  shift
  local line
  for line in "$@"; do printf '   %s\n' "$line"; done
}
# run CMD...: print it as typed, run it, indent its output; a failure ends the demo.
run() {
  local a shown="" typed=("$@")
  [ "$1" != retry_unavailable ] || typed=("${@:2}")
  for a in "${typed[@]}"; do
    case "$a" in *[!A-Za-z0-9_./=:,@%+-]*) shown+=" '$a'" ;; *) shown+=" $a" ;; esac
  done
  printf '%s$%s%s\n' "$B" "$shown" "$N"
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  [ -z "$out" ] || printf '%s\n' "$out" | sed 's/^/    /'
  [ $rc = 0 ] || fail "\`$*\` exited with $rc"
}
ok() { printf '%s   ✓ %s%s\n' "$G" "$1" "$N"; }
fail() {
  printf '%s   ✗ %s%s\n' "$R" "$1" "$N" >&2
  exit 1
}
# eventually DESCRIPTION CMD...: CMD succeeds within the deadline (silently retried), else fail.
eventually() {
  local what=$1 start
  shift
  start=$(date +%s)
  until "$@" >/dev/null 2>&1; do
    [ $(($(date +%s) - start)) -lt "$timeout" ] || fail "$what: not true after ${timeout}s"
    sleep 1
  done
  ok "$what ($(($(date +%s) - start))s)"
}
# can_i CONTEXT USER VERB RESOURCE NAMESPACE WANT: what RBAC on that member cluster answers,
# asked as the admin impersonating USER (kubectl auth can-i --as), equals WANT (yes or no).
can_i() { [ "$(kubectl --context "$1" auth can-i "$3" "$4" -n "$5" --as "$2" 2>/dev/null)" = "$6" ]; }
# show_can_i CONTEXT USER ... WANT: print the question and the answer, then check it.
show_can_i() {
  printf '%s$ kubectl --context %s auth can-i %s %s -n %s --as %s%s\n' "$B" "$1" "$3" "$4" "$5" "$2" "$N"
  local got
  got=$(kubectl --context "$1" auth can-i "$3" "$4" -n "$5" --as "$2" 2>/dev/null || true)
  printf '    %s\n' "$got"
  [ "$got" = "$6" ] || fail "$2 on $1: want $6, got $got"
}
# The checks capture a command's output before grep: `grep -q` stops reading at the first match,
# and under pipefail the writer's SIGPIPE would fail a check that passed.
connected() { local out; out=$(fleetctl cluster get "$1" -o json | tr -d ' \n') && grep -q '"type":"AgentConnected","status":"CONDITION_STATUS_TRUE"' <<<"$out"; }
# weight_of CLUSTER: the WEIGHT column of that cluster's rows of `fleetctl endpoints get web/shop`.
weights_of() { fleetctl endpoints get web/shop | awk -v c="$1" '$1 == c {print $4}' | sort -u | tr '\n' ' '; }
weights_are() { [ "$(weights_of "$1")" = "$2 " ]; }
reported_by_both() { local out; out=$(fleetctl endpoints get web/shop | awk '{print $1}') && grep -qx east <<<"$out" && grep -qx west <<<"$out"; }

# retry_unavailable CMD...: CMD, once more if it failed with `unavailable` (what a client retries).
retry_unavailable() {
  local out
  if out=$("$@" 2>&1); then printf '%s\n' "$out"; return 0; fi
  printf '%s\n' "$out"
  case "$out" in *unavailable:*) echo "(unavailable: retrying once)"; "$@" ;; *) return 1 ;; esac
}

# An earlier run that stopped half way left its objects: clear them quietly first.
cleanup() {
  fleetctl member remove team-a --user alice --role deployer >/dev/null 2>&1 || true
  for c in east west; do
    kubectl --context "$c" -n web delete service/shop endpointslice/shop-1 --ignore-not-found >/dev/null 2>&1 || true
    fleetctl namespace unbind web --project team-a --cluster "$c" >/dev/null 2>&1 || true
  done
  fleetctl role delete deployer >/dev/null 2>&1 || true
  fleetctl project delete team-a >/dev/null 2>&1 || true
}
if fleetctl project get team-a >/dev/null 2>&1 || fleetctl role get deployer >/dev/null 2>&1; then
  printf '%s(clearing what an earlier run of the demo left)%s\n' "$D" "$N"
  cleanup
fi

printf '%sFleetstream in five minutes%s: one hub (NATS JetStream + four services behind a gateway on\n' "$B" "$N"
printf 'http://127.0.0.1:18080) and two member clusters, east and west, each a real kube-apiserver\n'
printf 'with a cluster-agent that holds only the least-privilege ClusterRole of its Helm chart.\n'
printf '%sfleetctl talks to the gateway (FLEETSTREAM_SERVER, FLEETSTREAM_TOKEN_FILE: user dev-admin);\n' "$D"
printf 'kubectl uses each member'"'"'s admin kubeconfig, one context per member (KUBECONFIG).%s\n' "$N"

chapter "The fleet" \
  "Both clusters were registered with \`fleetctl cluster register\`; each agent connected to NATS" \
  "with the token registration printed, and now sends heartbeats and its namespace inventory."
run fleetctl cluster list
for c in east west; do connected "$c" || fail "cluster $c is not Connected"; done
ok "east and west are Connected"

chapter "A project with a namespace on both clusters" \
  "A project owns namespaces across clusters. Binding \`web\` on a cluster makes its agent create" \
  "the namespace, labelled with the project, and a ResourceQuota with the limits given."
run fleetctl project create team-a --display-name "Team A"
run fleetctl namespace bind web --project team-a --cluster east --hard cpu=2 --hard memory=4Gi
run fleetctl namespace bind web --project team-a --cluster west --hard cpu=2 --hard memory=4Gi
for c in east west; do
  eventually "namespace web with its quota exists on $c" \
    kubectl --context "$c" -n web get resourcequota fleetstream-quota
done
run kubectl --context east get namespace web --show-labels
run kubectl --context west -n web get resourcequota fleetstream-quota -o 'jsonpath={.spec.hard}{"\n"}'

chapter "A role template, and a member who holds it" \
  "A role template becomes the ClusterRole fleetstream:<name> on every cluster. Adding alice to" \
  "the project with it binds that role in each of the project's namespaces, on every cluster."
run fleetctl role create deployer --rule 'get,list,watch,create,update,patch,delete:deployments.apps,services'
run fleetctl member add team-a --user alice --role deployer
for c in east west; do
  eventually "alice can create deployments in web on $c" can_i "$c" alice create deployments.apps web yes
done

chapter "What RBAC on each member cluster says" \
  "kubectl asks each cluster's own authorizer: alice may create deployments in web; mallory, a" \
  "stranger, may not; and alice has nothing outside the project's namespace."
for c in east west; do
  show_can_i "$c" alice create deployments.apps web yes
  show_can_i "$c" mallory create deployments.apps web no
done
show_can_i east alice create deployments.apps default no
run kubectl --context west -n web get rolebindings

chapter "Revoking" \
  "Removing alice from the project removes her RoleBindings from every cluster."
run fleetctl member remove team-a --user alice --role deployer
for c in east west; do
  eventually "alice can no longer create deployments in web on $c" can_i "$c" alice create deployments.apps web no
  show_can_i "$c" alice create deployments.apps web no
done

chapter "One service, endpoints in two clusters" \
  "The agents report EndpointSlices; the endpoint collector merges them per service across" \
  "clusters. Here a Service shop with one endpoint on each cluster (no kubelets run in these" \
  "clusters, so we write the EndpointSlice a controller would)."
for c in east west; do
  ip=10.1.0.10
  [ "$c" = west ] && ip=10.2.0.10
  printf '%s$ kubectl --context %s apply -f - <<EOF  (Service web/shop, EndpointSlice shop-1: %s ready)%s\n' "$B" "$c" "$ip" "$N"
  kubectl --context "$c" apply -f - <<EOF | sed 's/^/    /' || fail "apply shop on $c"
apiVersion: v1
kind: Service
metadata: {name: shop, namespace: web}
spec:
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: shop-1
  namespace: web
  labels: {kubernetes.io/service-name: shop}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: [$ip]
    conditions: {ready: true}
EOF
done
eventually "the collector has shop's endpoints from east and west" reported_by_both
run fleetctl endpoints get web/shop

chapter "Draining a cluster" \
  "Weight 0 on a cluster drains it: its endpoints stay listed (they are still there) but get no" \
  "traffic from clients that follow the weights (the xDS/DNS consumers of the collector)."
run fleetctl endpoints weight web/shop --cluster east --weight 0
eventually "east's endpoints of shop have weight 0" weights_are east 0
weights_are west 100 || fail "west's endpoints of shop: want weight 100, got $(weights_of west)"
ok "west's endpoints of shop keep weight 100"
run fleetctl endpoints get web/shop

chapter "Putting the fleet back as we found it" \
  "Weights, the demo service, the namespaces' bindings (the namespaces stay, as --policy keep" \
  "says), the role template and the project are removed, so the demo can run again."
# A weight set back to 100 empties the service's weights entry; the collector sometimes misses
# that the entry is gone and answers `unavailable: weight accepted but not yet visible` after 10 s
# (a known endpoint-collector bug). The weight is stored; calling again returns at once.
run retry_unavailable fleetctl endpoints weight web/shop --cluster east --weight 100
for c in east west; do
  run kubectl --context "$c" -n web delete service/shop endpointslice/shop-1
  run fleetctl namespace unbind web --project team-a --cluster "$c"
done
run fleetctl role delete deployer
run fleetctl project delete team-a

printf '\n%s%sThe demo passed.%s Explore further: fleetctl --help, kubectl --context east|west ..., make compose-down.\n' "$G" "$B" "$N"
