#!/usr/bin/env bash
# Builds the control plane the cluster e2e tests run against: etcd, kube-apiserver
# and kubectl, from the Go module proxy only, at the versions pinned by the two
# tool modules under scripts/k8s-tools/ (kubernetes/: k8s.io/kubernetes with every
# staging module replaced by its published version; etcd/: go.etcd.io/etcd/server/v3).
#
# The binaries go to a cache directory named after a hash of the pins (both
# go.mod and go.sum files, the Go version and the build flags), so a machine that
# built them once pays nothing until a pin changes. Cold, the build takes about
# 8 minutes on 2 idle cores.
#
# Usage:
#   scripts/k8s-tools.sh          build if missing; print the directory
#   scripts/k8s-tools.sh dir      print the directory only (the e2e tests use this)
# DOTFORWARD_CACHE overrides the cache root (default ~/.cache/dotforward).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mods=$root/scripts/k8s-tools
flags=(-trimpath -ldflags=-s\ -w)
cache=${DOTFORWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dotforward}

# pins: everything that decides what the build produces.
pins() {
	cat "$mods/kubernetes/go.mod" "$mods/kubernetes/go.sum" "$mods/etcd/go.mod" "$mods/etcd/go.sum"
	go version
	echo "${flags[*]}"
}
hash=$(pins | sha256sum | cut -c1-16)
dir=$cache/k8s-$hash

if [[ ${1:-} == dir ]]; then
	echo "$dir"
	exit 0
fi

if [[ -x $dir/etcd && -x $dir/kube-apiserver && -x $dir/kubectl ]]; then
	echo "$dir"
	exit 0
fi

echo "k8s-tools: building etcd, kube-apiserver and kubectl into $dir (about 8 minutes cold)" >&2
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/k8s-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
# -mod=readonly: the pins are exactly the checked-in go.mod and go.sum.
(cd "$mods/kubernetes" && GOFLAGS=-mod=readonly GOWORK=off go build "${flags[@]}" -o "$tmp/" \
	k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl)
(cd "$mods/etcd" && GOFLAGS=-mod=readonly GOWORK=off go build "${flags[@]}" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
"$tmp/etcd" --version >/dev/null
"$tmp/kube-apiserver" --version >/dev/null
"$tmp/kubectl" version --client >/dev/null
# Renaming the finished directory into place makes a half-done build invisible:
# an interrupted run leaves only a k8s-build.* directory, removed by the trap.
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "k8s-tools: built in $((SECONDS - start)) s" >&2
echo "$dir"
