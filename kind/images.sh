#!/usr/bin/env bash
# make images: build the bind, mutate and check images from the repository root (the core
# package goes into both function images) and load them into every kind node. Nothing is
# pushed: Knative does not resolve kind.local tags (config-deployment's
# registries-skipping-tag-resolving), and the `:dev` tags make IfNotPresent the default pull
# policy, so the kubelet uses the loaded images.
set -euo pipefail
# shellcheck source=kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

step "Prerequisites"
require docker kind

build() {  # build DOCKERFILE IMAGE
  step "docker build -f $1 -t $2"
  docker build --file "$REPO_ROOT/$1" --tag "$2" "$REPO_ROOT"
}
build Dockerfile.bind "$BIND_IMAGE"
build Dockerfile.mutate "$MUTATE_IMAGE"
build Dockerfile.check "$CHECK_IMAGE"

step "kind load docker-image into '$KIND_CLUSTER'"
kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER" || die "no kind cluster '$KIND_CLUSTER': run 'make kind-up' first"
kind load docker-image --name "$KIND_CLUSTER" "$BIND_IMAGE" "$MUTATE_IMAGE" "$CHECK_IMAGE"
ok "loaded $BIND_IMAGE $MUTATE_IMAGE $CHECK_IMAGE"
