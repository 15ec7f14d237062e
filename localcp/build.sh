#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kubectl 1.20.2 from Debian bookworm's
# `kubernetes` source package, once, into a cache outside the repo. Idempotent: exits at once
# when the binaries are already there. Installs etcd (Debian's etcd-server) too.
set -euo pipefail
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
BIN="$CACHE/bin"
WANT=(kube-apiserver kube-controller-manager kubectl)

have_all() { for b in "${WANT[@]}"; do [ -x "$BIN/$b" ] || return 1; done; command -v etcd >/dev/null; }
if have_all; then echo "control plane: cached binaries in $BIN"; exit 0; fi

SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
  echo "control plane: adding deb-src lines for bookworm"
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    | $SUDO tee /etc/apt/sources.list.d/gpu-scheduler-src.sources >/dev/null
fi
echo "control plane: apt-get update and install (etcd-server golang-go rsync dpkg-dev reflect2)"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends etcd-server golang-go rsync dpkg-dev \
  golang-github-modern-go-reflect2-dev ca-certificates >/dev/null
for b in "${WANT[@]}"; do [ -x "$BIN/$b" ] || missing=1; done
if [ "${missing:-0}" = 0 ]; then exit 0; fi

SRC="$CACHE/src"
rm -rf "$SRC"; mkdir -p "$SRC" "$BIN"
echo "control plane: fetching Debian's kubernetes 1.20.2 source package"
(cd "$SRC" && apt-get source -qq --download-only kubernetes >/dev/null && dpkg-source -x kubernetes_*.dsc tree >/dev/null)
TREE="$SRC/tree"
# vendored reflect2 1.0.1 + Go 1.19 segfaults the API server on the first webhook patch.
rm -rf "$TREE/vendor/github.com/modern-go/reflect2"
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$TREE/vendor/github.com/modern-go/reflect2"
mkdir -p "$SRC/gopath/src/k8s.io"; ln -sfn "$TREE" "$SRC/gopath/src/k8s.io/kubernetes"
echo "control plane: building (about 6-10 minutes on 2 cores, once)"
start=$(date +%s)
(cd "$SRC/gopath/src/k8s.io/kubernetes" && GOPATH="$SRC/gopath" GO111MODULE=off GOFLAGS=-mod=vendor GOCACHE="$CACHE/gocache" \
  make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kubectl" 2>&1 | while IFS= read -r l; do echo "  [build $(( $(date +%s) - start ))s] $l"; done)
for b in "${WANT[@]}"; do cp "$TREE/_output/local/bin/linux/"*/"$b" "$BIN/$b" 2>/dev/null || cp "$TREE/_output/bin/$b" "$BIN/$b"; done
rm -rf "$SRC" "$CACHE/gocache"
echo "control plane: built in $(( $(date +%s) - start ))s into $BIN"
