#!/usr/bin/env bash
# Builds what the local stack's cluster network runs (localcp/network.py), once, into the cache;
# each piece is skipped when it is there. Called by localcp/build.sh (both modes).
#   - kube-proxy at the Kubernetes version of the setting GPU_SCHEDULER_K8S, the control plane's
#     build: from the same generated module as the other components (localcp/k8smodule.sh), into
#     the same ~/.cache/gpu-scheduler/k8s-<version>/bin.
#   - nft, for kube-proxy's nftables mode: Debian bookworm's nftables and the libraries it needs
#     that a bookworm machine may lack, unpacked with dpkg -x (nothing installed); bin/nft is a
#     wrapper that finds them.
#   - CoreDNS, at GPU_SCHEDULER_COREDNS (localcp/build-coredns.sh).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=localcp/versions.sh
source "$HERE/versions.sh"
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
BIN="$CACHE/k8s-$K8S_VERSION/bin"
NFT_DIR="$CACHE/nftables-bookworm"
NFT_PACKAGES=(nftables libnftables1 libnftnl11 libmnl0 libjansson4 libxtables12 libedit2 libgmp10 libbsd0 libmd0)

log() { echo "network: $*"; }

if [ ! -x "$BIN/kube-proxy" ]; then
  start=$SECONDS
  mod="$CACHE/k8s-$K8S_VERSION/module"
  mkdir -p "$mod" "$BIN"
  (
    cd "$mod"
    # shellcheck source=localcp/k8smodule.sh
    source "$HERE/k8smodule.sh"
    export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
    [ -f go.mod ] || k8s_build_module k8s-build "$K8S_VERSION"
    log "kube-proxy $K8S_VERSION: go build (a minute or two once the control plane is built)"
    go build -trimpath -ldflags "$(k8s_ldflags "$K8S_VERSION")" -o "$BIN/" k8s.io/kubernetes/cmd/kube-proxy 2>&1 |
      sed 's/^/  [go build] /'
  )
  [ -x "$BIN/kube-proxy" ] || { log "the build finished without $BIN/kube-proxy"; exit 1; }
  log "$("$BIN/kube-proxy" --version) in $((SECONDS - start))s"
fi

if [ ! -x "$NFT_DIR/bin/nft" ]; then
  start=$SECONDS
  # shellcheck source=localcp/debian.sh
  source "$HERE/debian.sh"
  rm -rf "$NFT_DIR"; mkdir -p "$NFT_DIR/bin"
  log "nft from Debian bookworm (private apt state in $NFT_DIR/fetch)"
  debian_unpack bookworm "$NFT_DIR/fetch" "${NFT_PACKAGES[@]}"
  mv "$NFT_DIR/fetch/root" "$NFT_DIR/root"
  rm -rf "$NFT_DIR/fetch"
  libs="$(find "$NFT_DIR/root" -name 'libnftables.so.*' -printf '%h' -quit)"
  cat >"$NFT_DIR/bin/nft.part" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$libs" exec "$NFT_DIR/root/usr/sbin/nft" "\$@"
EOF
  chmod 755 "$NFT_DIR/bin/nft.part"
  mv "$NFT_DIR/bin/nft.part" "$NFT_DIR/bin/nft"
  log "$("$NFT_DIR/bin/nft" --version) in $((SECONDS - start))s"
fi

bash "$HERE/build-coredns.sh"
