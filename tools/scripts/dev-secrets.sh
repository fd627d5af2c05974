#!/usr/bin/env bash
# Creates the DEV-ONLY secrets of the local compose stack under .data/compose/ (git-ignored),
# once per checkout, each a fresh random value. Nothing here is ever used in production.
#
#   .data/compose/nats.env     NATS_TOKEN=<t>   read by the three NATS servers (env_file)
#   .data/compose/nats-token   <t>              --nats-token-file of every service
#   .data/compose/api-tokens   <t2>,dev-admin   --token-file of every service (bearer tokens)
#
# The token files are world-readable because the containers run as uid 65532; the directory is
# not.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=.data/compose
mkdir -p "$dir"
chmod 700 .data "$dir" 2>/dev/null || true
rand() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

if [ ! -s "$dir/nats-token" ] || [ ! -s "$dir/nats.env" ]; then
  t=$(rand)
  printf '%s\n' "$t" >"$dir/nats-token"
  printf 'NATS_TOKEN=%s\n' "$t" >"$dir/nats.env"
  echo "created $dir/nats-token and $dir/nats.env (dev-only NATS token)"
fi
if [ ! -s "$dir/api-tokens" ]; then
  printf '%s,dev-admin\n' "$(rand)" >"$dir/api-tokens"
  echo "created $dir/api-tokens (dev-only API bearer token for user dev-admin)"
fi
chmod 644 "$dir/nats-token" "$dir/api-tokens"
chmod 600 "$dir/nats.env"
