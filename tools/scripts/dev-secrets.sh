#!/usr/bin/env bash
# Creates the DEV-ONLY secrets of the local compose stack under .data/compose/ (git-ignored),
# once per checkout, each a fresh random value. Nothing here is ever used in production.
#
#   .data/compose/nats.env                 read by the three NATS servers (env_file):
#                                          NATS_CALLOUT_PASSWORD  cluster-import's static NATS users (callout, system)
#                                          NATS_CALLOUT_ISSUER    public key signing callout answers
#                                          NATS_CALLOUT_XKEY      public key encrypting callout traffic
#                                          NATS_ADMIN_PASSWORD    fleetstream-admin's password (backups, restores)
#   .data/compose/nats/admin.password            the same, for fleetctl admin --nats-user fleetstream-admin --nats-token-file
#   .data/compose/nats/cluster-import.password   cluster-import's NATS password (--nats-user cluster-import)
#   .data/compose/nats/callout-issuer.seed       --nats-callout-issuer-seed-file of cluster-import
#   .data/compose/nats/callout-xkey.seed         --nats-callout-xkey-seed-file of cluster-import
#   .data/compose/nats/<service>.token           --nats-token-file of each other hub service
#   .data/compose/nats/service-tokens            --nats-service-tokens-file of cluster-import
#                                                (token,service per line)
#   .data/compose/api-tokens   <t>,dev-admin     --token-file of every service (bearer tokens); its
#                              <t>,kube-bridge   first line is the admin's, the second the kube bridge's user
#   .data/compose/kube-bridge/api-token       the kube bridge's user's token (--kube-bridge-api-token-file)
#   .data/compose/kube-bridge/projects-token  dev-admin's token, for the hub's Project objects
#                                             (--kube-bridge-projects-token-file)
#   .data/compose/credentials-key  dev-1:<key>   --credentials-key-file of cluster-import
#
# Each container mounts only its own NATS secret. The files are world-readable because the
# containers run as uid 65532; the directories are not.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=.data/compose
nats="$dir/nats"
mkdir -p "$dir" "$nats"
chmod 700 .data "$dir" "$nats" 2>/dev/null || true
rand() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
# hosted-agent is cluster-agent --hosted: a hub service on NATS like the others.
services="namespace-binding rbac-sync endpoint-collector hosted-agent kube-bridge"

complete=yes
for f in "$dir/nats.env" "$nats/cluster-import.password" "$nats/admin.password" "$nats/callout-issuer.seed" "$nats/callout-xkey.seed" "$nats/service-tokens"; do
  [ -s "$f" ] || complete=no
done
for s in $services; do [ -s "$nats/$s.token" ] || complete=no; done
grep -q '^NATS_CALLOUT_ISSUER=' "$dir/nats.env" 2>/dev/null || complete=no
grep -q '^NATS_ADMIN_PASSWORD=' "$dir/nats.env" 2>/dev/null || complete=no
if [ "$complete" = no ]; then
  # All NATS secrets are made together: they must agree with each other.
  rm -f "$dir/nats-token" # the shared token of earlier versions
  pw=$(rand)
  printf '%s\n' "$pw" >"$nats/cluster-import.password"
  root=$(pwd)
  keys=$(cd services/cluster-import && go run ./cmd/nats-callout-keys "$root/$nats/callout-issuer.seed" "$root/$nats/callout-xkey.seed")
  admin=$(rand)
  printf '%s\n' "$admin" >"$nats/admin.password"
  { printf 'NATS_CALLOUT_PASSWORD=%s\n' "$pw"; printf '%s\n' "$keys"; printf 'NATS_ADMIN_PASSWORD=%s\n' "$admin"; } >"$dir/nats.env"
  : >"$nats/service-tokens"
  for s in $services; do
    t=$(rand)
    printf '%s\n' "$t" >"$nats/$s.token"
    printf '%s,%s\n' "$t" "$s" >>"$nats/service-tokens"
  done
  echo "created $dir/nats.env and $nats/ (dev-only NATS callout keys, cluster-import's password, one token per service)"
fi
if [ ! -s "$dir/api-tokens" ]; then
  printf '%s,dev-admin\n' "$(rand)" >"$dir/api-tokens"
  echo "created $dir/api-tokens (dev-only API bearer token for user dev-admin)"
fi
# The kube bridge writes through the API as a user of its own (docs/kubernetes.md), who has no
# role until a platform admin grants it one per mapped project.
bridge="$dir/kube-bridge"
mkdir -p "$bridge"
if ! grep -q ',kube-bridge$' "$dir/api-tokens"; then
  printf '%s,kube-bridge\n' "$(rand)" >>"$dir/api-tokens"
  echo "added the kube bridge's user to $dir/api-tokens"
fi
grep -m1 ',kube-bridge$' "$dir/api-tokens" | cut -d, -f1 >"$bridge/api-token"
head -n1 "$dir/api-tokens" | cut -d, -f1 >"$bridge/projects-token"
if [ ! -s "$dir/credentials-key" ]; then
  printf 'dev-1:%s\n' "$(head -c 32 /dev/urandom | base64)" >"$dir/credentials-key"
  echo "created $dir/credentials-key (dev-only key sealing cluster credentials at rest)"
fi
chmod 755 "$bridge"
chmod 644 "$dir/api-tokens" "$dir/credentials-key" "$nats"/* "$bridge"/*
chmod 600 "$dir/nats.env"
