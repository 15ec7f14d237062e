#!/usr/bin/env bash
# Builds the real upstream components the local stack runs, once, into a cache outside the repo
# keyed by version; exits at once when they are there.
#   - kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet v1.34.0 (the
#     kind node image's version) from a small generated Go module that requires
#     k8s.io/kubernetes v1.34.0, its staging modules replaced by their v0.34.0 releases
#     (localcp/k8smodule.sh says why).
#   - etcd from Debian trixie's etcd-server (bookworm's is 3.4), downloaded and unpacked with
#     dpkg -x through a private apt state: nothing is installed or configured system-wide.
# Sibling scripts add the nodes' parts, helm, the DRA test driver, the workload controllers
# (JobSet, LeaderWorkerSet) and Argo CD's CRDs.
# Modules come through the machine's own Go proxy configuration; Debian packages through the
# mirror its apt sources name.
set -euo pipefail
K8S_VERSION="${K8S_VERSION:-v1.34.0}"
ETCD_SUITE=trixie
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
BIN="$CACHE/k8s-$K8S_VERSION/bin"
ETCD_DIR="$CACHE/etcd-$ETCD_SUITE"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)

log() { echo "control plane: $*"; }
have_k8s() { for b in "${COMPONENTS[@]}"; do [ -x "$BIN/$b" ] || return 1; done; }
have_etcd() { [ -x "$ETCD_DIR/bin/etcd" ]; }
# Real nodes: containerd, runc, CNI plugins and the check image's base (a sibling script).
bash "$(dirname "${BASH_SOURCE[0]}")/build-node.sh"
# helm, for the chart (chart/gpu-scheduler): here rather than last, as the line below exits early.
bash "$(dirname "${BASH_SOURCE[0]}")/build-helm.sh"
# Kubernetes' DRA test driver, the real nodes' DRA kubelet plugin (likewise before the exit).
bash "$(dirname "${BASH_SOURCE[0]}")/build-dra.sh"
# The real JobSet and LeaderWorkerSet controllers with their CRDs and webhooks, which
# localcp/workloads.py runs beside the control plane (likewise before the exit).
bash "$(dirname "${BASH_SOURCE[0]}")/build-workloads.sh"
# Argo CD's CRDs, for tests/test_argocd.py's server-side dry run of argocd/ (likewise).
bash "$(dirname "${BASH_SOURCE[0]}")/fetch-argocd-crds.sh"
if have_k8s && have_etcd; then log "cached: $BIN, $ETCD_DIR/bin"; exit 0; fi

for tool in go python3 apt-get dpkg; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done

# shellcheck source=localcp/debian.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian.sh"
# shellcheck source=localcp/k8smodule.sh
source "$(dirname "${BASH_SOURCE[0]}")/k8smodule.sh"

build_etcd() {
  local start=$SECONDS
  rm -rf "$ETCD_DIR"; mkdir -p "$ETCD_DIR/bin"
  log "etcd: etcd-server from Debian $ETCD_SUITE (private apt state in $ETCD_DIR/fetch)"
  debian_unpack "$ETCD_SUITE" "$ETCD_DIR/fetch" etcd-server
  cp "$ETCD_DIR/fetch/root/usr/bin/etcd" "$ETCD_DIR/bin/etcd"
  rm -rf "$ETCD_DIR/fetch"
  log "etcd: $("$ETCD_DIR/bin/etcd" --version | head -1) in $((SECONDS - start))s"
}

build_k8s() {
  local mod="$CACHE/k8s-$K8S_VERSION/module" start=$SECONDS
  rm -rf "$mod"; mkdir -p "$mod" "$BIN"
  cd "$mod"
  log "kubernetes $K8S_VERSION: generating the build module"
  k8s_build_module k8s-build "$K8S_VERSION"
  local ldflags
  ldflags=$(k8s_ldflags "$K8S_VERSION")
  local pkgs=()
  for b in "${COMPONENTS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  log "kubernetes $K8S_VERSION: go build ${COMPONENTS[*]} (about 5 minutes on 2 cores, once)"
  go build -trimpath -ldflags "$ldflags" -o "$BIN/" "${pkgs[@]}" 2>&1 | sed 's/^/  [go build] /'
  have_k8s || { log "the build finished without every binary in $BIN"; exit 1; }
  log "kubernetes $K8S_VERSION: built in $((SECONDS - start))s into $BIN"
}

have_etcd || build_etcd
have_k8s || build_k8s
"$BIN/kube-apiserver" --version
