#!/usr/bin/env bash
# Fetches Argo CD's CRDs (Application, ApplicationSet, AppProject) from its Go module
# github.com/argoproj/argo-cd/v3 (manifests/crds/ in the module's source), once, into a cache
# outside the repo keyed by version; exits at once when they are there. tests/test_argocd.py
# installs them in the local control plane to check argocd/*.yaml with a strict server-side dry
# run. Modules come through the machine's own Go proxy configuration; nothing is built.
#   bash localcp/fetch-argocd-crds.sh           fetch (or find) them
#   bash localcp/fetch-argocd-crds.sh --path    print the directory (fetched or not)
set -euo pipefail
ARGOCD_VERSION="${ARGOCD_VERSION:-v3.2.0}"
CACHE="${GPU_SCHEDULER_CACHE:-$HOME/.cache/gpu-scheduler}"
DIR="$CACHE/argocd-$ARGOCD_VERSION"
CRDS="$DIR/crds"
MODULE=github.com/argoproj/argo-cd/v3

if [ "${1:-}" = --path ]; then echo "$CRDS"; exit 0; fi
log() { echo "argo cd crds: $*"; }
if [ -f "$CRDS/.complete" ]; then log "cached: $CRDS"; exit 0; fi
command -v go >/dev/null || { log "go is required"; exit 1; }
command -v python3 >/dev/null || { log "python3 is required"; exit 1; }

start=$SECONDS
rm -rf "$DIR/module" "$CRDS"; mkdir -p "$DIR/module" "$CRDS"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
cd "$DIR/module"
# A module of our own, only so that `go mod download` has somewhere to run: it downloads the
# module's source zip (verified against the checksum database) and prints where it unpacked it.
go mod init gpu-scheduler.local/argocd-crds >/dev/null 2>&1
log "$MODULE@$ARGOCD_VERSION: go mod download (its source, once)"
source_dir=$(go mod download -json "$MODULE@$ARGOCD_VERSION" |
  python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["Error"]) if d.get("Error") else print(d["Dir"])')
found=0
for crd in "$source_dir"/manifests/crds/*-crd.yaml; do
  cp "$crd" "$CRDS/"; found=$((found + 1))
done
[ "$found" -gt 0 ] || { log "no manifests/crds/*-crd.yaml in $source_dir"; exit 1; }
echo "$MODULE@$ARGOCD_VERSION" > "$CRDS/.complete"
log "$found CRDs in $((SECONDS - start))s: $CRDS"
