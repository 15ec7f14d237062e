#!/usr/bin/env bash
# Builds the real upstream components the local stack runs, once, into a cache outside the repo
# keyed by version; each piece is skipped when it is there, so a second run takes a second.
#   - kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet at the
#     Kubernetes version of the setting GPU_SCHEDULER_K8S (localcp/versions.env, default v1.37.2;
#     `make K8S=v1.33.13`), from a small generated Go module that requires k8s.io/kubernetes at it,
#     its staging modules replaced by their v0.N.M releases (localcp/k8smodule.sh says why), into
#     ~/.cache/gpu-scheduler/k8s-<version>/bin: one directory per version, beside the others.
#   - etcd from Debian trixie's etcd-server (bookworm's is 3.4), downloaded and unpacked with
#     dpkg -x through a private apt state: nothing is installed or configured system-wide.
# Sibling scripts add the nodes' parts, the DRA test driver (same version; from 1.34, the first
# that serves resource.k8s.io/v1), the cluster network's kube-proxy, nft and CoreDNS, helm, the
# workload controllers (JobSet, LeaderWorkerSet, Kueue), Argo CD's CRDs, Knative, Traefik (Knative's
# networking layer here), kn and func.
#   bash localcp/build.sh           everything the tests and the benchmarks use (make test, make bench)
#   bash localcp/build.sh --stack   only what a stack runs (make demo): the control plane, etcd, the
#                                   nodes' parts, the DRA test driver, the cluster network and Knative
#                                   Eventing (its receive adapter); not helm, Knative Serving, the workload
#                                   controllers (bash localcp/build-workloads.sh [jobset|lws|kueue]...)
#                                   or Argo CD's CRDs
# K8S_VERSION=<v> names the Kubernetes version of one call, before GPU_SCHEDULER_K8S.
# Modules come through the machine's own Go proxy configuration; Debian packages through the
# mirror its apt sources name.
set -euo pipefail
HERE="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=localcp/versions.sh
source "$HERE/versions.sh"
ETCD_SUITE=trixie
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
BIN="$CACHE/k8s-$K8S_VERSION/bin"
ETCD_DIR="$CACHE/etcd-$ETCD_SUITE"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)

stack_only=false
case "${1:-}" in
  '') ;;
  --stack) stack_only=true ;;
  *) echo "usage: bash localcp/build.sh [--stack]" >&2; exit 2 ;;
esac

log() { echo "control plane: $*"; }
have_k8s() { for b in "${COMPONENTS[@]}"; do [ -x "$BIN/$b" ] || return 1; done; }
have_etcd() { [ -x "$ETCD_DIR/bin/etcd" ]; }

build_etcd() {
  local start=$SECONDS
  # shellcheck source=localcp/debian.sh
  source "$HERE/debian.sh"
  rm -rf "$ETCD_DIR"; mkdir -p "$ETCD_DIR/bin"
  log "etcd: etcd-server from Debian $ETCD_SUITE (private apt state in $ETCD_DIR/fetch)"
  debian_unpack "$ETCD_SUITE" "$ETCD_DIR/fetch" etcd-server
  cp "$ETCD_DIR/fetch/root/usr/bin/etcd" "$ETCD_DIR/bin/etcd"
  rm -rf "$ETCD_DIR/fetch"
  log "etcd: $("$ETCD_DIR/bin/etcd" --version | head -1) in $((SECONDS - start))s"
}

build_k8s() {
  local mod="$CACHE/k8s-$K8S_VERSION/module" start=$SECONDS
  # shellcheck source=localcp/k8smodule.sh
  source "$HERE/k8smodule.sh"
  rm -rf "$mod"; mkdir -p "$mod" "$BIN"
  (
    cd "$mod"
    log "kubernetes $K8S_VERSION: generating the build module"
    k8s_build_module k8s-build "$K8S_VERSION"
    local ldflags
    ldflags=$(k8s_ldflags "$K8S_VERSION")
    local pkgs=()
    for b in "${COMPONENTS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
    log "kubernetes $K8S_VERSION: go build ${COMPONENTS[*]} (about 5 minutes on 2 cores, once)"
    go build -trimpath -ldflags "$ldflags" -o "$BIN/" "${pkgs[@]}" 2>&1 | sed 's/^/  [go build] /'
  )
  have_k8s || { log "the build finished without every binary in $BIN"; exit 1; }
  log "kubernetes $K8S_VERSION: built in $((SECONDS - start))s into $BIN"
}

# Real nodes: containerd, runc, CNI plugins and the check image's base (a sibling script).
bash "$HERE/build-node.sh"
if ! have_k8s || ! have_etcd; then
  for tool in go python3 apt-get dpkg; do
    command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
  done
fi
have_etcd || build_etcd
if have_k8s; then log "cached: $BIN, $ETCD_DIR/bin"; else build_k8s; fi
"$BIN/kube-apiserver" --version
# Kubernetes' DRA test driver at the same version, the real nodes' DRA kubelet plugin (a no-op
# before 1.34: nothing there serves resource.k8s.io/v1, and the nodes run no driver).
bash "$HERE/build-dra.sh"
# The cluster network of the real nodes: kube-proxy (same version), nft, CoreDNS.
bash "$HERE/build-network.sh"
# Knative Eventing: its ApiServerSource receive adapter delivers the pods' events to bind on every
# stack (localcp/adapter.py).
bash "$HERE/build-knative.sh" eventing
if $stack_only; then exit 0; fi
# helm, for the chart (chart/gpu-scheduler).
bash "$HERE/build-helm.sh"
# The real JobSet, LeaderWorkerSet and Kueue controllers with their CRDs and webhooks, which
# localcp/workloads.py runs beside the control plane, at GPU_SCHEDULER_JOBSET, _LWS, _KUEUE.
bash "$HERE/build-workloads.sh"
# Argo CD's CRDs, for tests/test_argocd.py's server-side dry run of argocd/.
bash "$HERE/fetch-argocd-crds.sh"
# Knative Serving too, which localcp/knative.py installs with Eventing for the tests that run the
# project on real Knative (make demo KNATIVE=1 builds it alone).
bash "$HERE/build-knative.sh" serving
# Knative's networking layer (Traefik's Knative provider: localcp/traefik.py), which the Knative
# stack installs with Knative so that Routes become Ready, and kn and func, Knative's CLIs (make
# demo KNATIVE=1 builds them alone; func deploys bind and mutate there: tests/test_func_cluster.py).
bash "$HERE/build-traefik.sh"
bash "$HERE/build-kn.sh"
bash "$HERE/build-func.sh"
