#!/usr/bin/env bash
# make down: delete the kind cluster and everything in it (the images stay in Docker).
set -euo pipefail
# shellcheck source=kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require kind
if kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
  kind delete cluster --name "$KIND_CLUSTER"
else
  ok "no cluster '$KIND_CLUSTER'; nothing to delete"
fi
