#!/usr/bin/env bash
# Builds Kubernetes' own DRA test driver, k8s.io/kubernetes/test/e2e/dra/test-driver at the control
# plane's release (GPU_SCHEDULER_K8S, localcp/versions.env), once, into a cache outside the repo
# keyed by version; exits at once when it is there. Called by localcp/build.sh. The real nodes run
# it as their DRA kubelet plugin (localcp/nodes.py): it publishes a ResourceSlice of devices
# device-00, device-01, ... for its node and injects env (claim_<claim>_<request>=true) into the
# containers of a claim through CDI. Before 1.34 it is not built: those API servers do not serve
# resource.k8s.io/v1 (1.33's DRA is beta and off by default), and the nodes run no driver.
#   bash localcp/build-dra.sh           build (or find) it
#   bash localcp/build-dra.sh --path    print where it is (built or not)
set -euo pipefail
# shellcheck source=localcp/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
DIR="$CACHE/dra-test-driver-$K8S_VERSION"
DRIVER="$DIR/bin/dra-test-driver"

if [ "${1:-}" = --path ]; then echo "$DRIVER"; exit 0; fi
log() { echo "dra test driver: $*"; }
if ! k8s_dra_served "$K8S_VERSION"; then log "$K8S_VERSION serves no resource.k8s.io/v1 (from 1.34): not built, not run"; exit 0; fi
if [ -x "$DRIVER" ]; then log "cached: $DRIVER"; exit 0; fi
for tool in go python3; do
  command -v "$tool" >/dev/null || { log "$tool is required"; exit 1; }
done
# shellcheck source=localcp/k8smodule.sh
source "$(dirname "${BASH_SOURCE[0]}")/k8smodule.sh"

start=$SECONDS
rm -rf "$DIR/module"; mkdir -p "$DIR/module" "$DIR/bin"
cd "$DIR/module"
k8s_build_module dra-test-driver-build "$K8S_VERSION"
log "k8s.io/kubernetes/test/e2e/dra/test-driver $K8S_VERSION: go build (a few minutes on 2 cores, once)"
go build -trimpath -ldflags "$(k8s_ldflags "$K8S_VERSION")" -o "$DRIVER.tmp" \
  k8s.io/kubernetes/test/e2e/dra/test-driver 2>&1 | sed 's/^/  [go build] /'
mv "$DRIVER.tmp" "$DRIVER"
log "built in $((SECONDS - start))s: $DRIVER"
