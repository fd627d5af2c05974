#!/usr/bin/env bash
# Builds kube-apiserver and etcd once into a versioned cache outside the work tree and prints the
# directory (the KUBEBUILDER_ASSETS layout envtest expects). Later runs are a no-op.
set -euo pipefail
# The tool modules are deliberately outside go.work.
export GOWORK=off
here=$(cd "$(dirname "$0")" && pwd)
version() { grep -oE "$1 v[^ ]+" "$2" | head -1 | cut -d' ' -f2; }
kube=$(version 'k8s.io/kubernetes' "$here/kube-apiserver/go.mod")
etcd=$(version 'go.etcd.io/etcd/server/v3' "$here/etcd/go.mod")
dir="${FLEETSTREAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetstream}/kube-${kube}-etcd-${etcd}"
mkdir -p "$dir"
# One build at a time: concurrent `make test`s (or engineers) would each spend minutes building the
# same binaries and race on the same .tmp files. The others wait and then find them built.
exec 9>"$dir/.lock"
flock 9
if [ ! -x "$dir/kube-apiserver" ]; then
  (cd "$here/kube-apiserver" && CGO_ENABLED=0 go build -trimpath \
    -ldflags "-X k8s.io/component-base/version.gitVersion=${kube} -X k8s.io/component-base/version.gitMajor=$(echo "$kube" | cut -d. -f1 | tr -d v) -X k8s.io/component-base/version.gitMinor=$(echo "$kube" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean" \
    -o "$dir/kube-apiserver.tmp" . && mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver") >&2
fi
if [ ! -x "$dir/etcd" ]; then
  (cd "$here/etcd" && CGO_ENABLED=0 go build -trimpath -o "$dir/etcd.tmp" . && mv "$dir/etcd.tmp" "$dir/etcd") >&2
fi
echo "$dir"
