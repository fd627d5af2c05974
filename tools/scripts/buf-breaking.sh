#!/usr/bin/env bash
# Checks proto/ for breaking changes (buf.yaml's rules): against the newest release tag (v*) if
# there is one, else against the previous commit, or against HEAD when the working tree has
# changes to proto/ (what a developer is about to commit). Needs the git history, not the
# network.
set -euo pipefail
cd "$(dirname "$0")/../.."
buf=${BUF:-bin/buf}
against=""
if tag=$(git describe --tags --abbrev=0 --match 'v*' 2>/dev/null); then
  against=$tag
elif ! git diff --quiet HEAD -- proto 2>/dev/null || [ -n "$(git ls-files --others --exclude-standard proto)" ]; then
  against=HEAD
elif git rev-parse -q --verify HEAD~1 >/dev/null; then
  against=HEAD~1
else
  echo "buf breaking: no earlier revision to compare with"; exit 0
fi
echo "buf breaking against $against"
"$buf" breaking proto --against ".git#ref=$against,subdir=proto"
