#!/usr/bin/env bash
# Builds the real upstream components the local stack runs, once, into a cache outside the repo
# keyed by version; exits at once when they are there.
#   - kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet v1.34.0 (the
#     kind node image's version) from a small generated Go module that requires
#     k8s.io/kubernetes v1.34.0. That module's go.mod requires its staging modules (k8s.io/api,
#     k8s.io/client-go, ...) at v0.0.0 and replaces them with its own ./staging tree; outside the
#     kubernetes repo we replace each of them with the published v0.34.0 instead. Only versions
#     that are exactly v0.0.0: k8s.io/utils and k8s.io/kube-openapi carry v0.0.0-<date>-<hash>
#     pseudo-versions, which are real and have no v0.34.0.
#   - etcd from Debian trixie's etcd-server (bookworm's is 3.4), downloaded and unpacked with
#     dpkg -x through a private apt state: nothing is installed or configured system-wide.
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
if have_k8s && have_etcd; then log "cached: $BIN, $ETCD_DIR/bin"; exit 0; fi

for tool in go python3 apt-get dpkg; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done

# shellcheck source=localcp/debian.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian.sh"

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
  local mod="$CACHE/k8s-$K8S_VERSION/module" start=$SECONDS minor
  rm -rf "$mod"; mkdir -p "$mod" "$BIN"
  export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
  cd "$mod"
  log "kubernetes $K8S_VERSION: generating the build module"
  go mod init gpu-scheduler.local/k8s-build >/dev/null 2>&1
  local upstream
  upstream=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  # Every requirement pinned at exactly v0.0.0 is a staging module: use its published release.
  local staging=${K8S_VERSION/v1./v0.}
  go mod edit -json "$upstream" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Require") or []:
    if r["Version"] == "v0.0.0":
        print(r["Path"])' | while read -r path; do go mod edit -replace="$path=$path@$staging"; done
  # Tell the binaries their version, as the release build does (kubectl version, discovery).
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local v=k8s.io/component-base/version
  local ldflags="-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
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
