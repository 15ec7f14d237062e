#!/usr/bin/env bash
# Builds func, Knative Functions' CLI (knative.dev/func at GPU_SCHEDULER_FUNC, localcp/versions.env),
# once, into a cache outside the repo keyed by version; exits at once when it is there. From a
# small generated module that requires it, with upstream's go.sum and upstream's one `replace`
# (github.com/imdario/mergo => dario.cat/mergo, read from its go.mod: a dependency's replaces are
# not honoured, and without it nothing resolves). Stamped through the ldflags of upstream's
# Makefile (knative.dev/func/pkg/app.vers and .hash, the commit the module proxy names), so `func
# version` tells instead of printing v0.0.0+source. Static, about 5 minutes on 2 cores, 84 MB, once.
#   bash localcp/build-func.sh          build (or find) it
#   bash localcp/build-func.sh --path   print where it is (built or not)
# Modules come through the machine's own Go proxy configuration, without its `direct` fallback
# (localcp/gomodule.sh).
set -euo pipefail
# shellcheck source=localcp/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
# shellcheck source=localcp/gomodule.sh
source "$(dirname "${BASH_SOURCE[0]}")/gomodule.sh"
: "${GPU_SCHEDULER_FUNC:?}"
MODULE=knative.dev/func

cached_program func "$GPU_SCHEDULER_FUNC" "${1:-}"

start=$SECONDS
own_module "$DIR" func "$MODULE" "$GPU_SCHEDULER_FUNC"
# Upstream's replace lines, as its go.mod writes them (only mergo in v0.44.0).
sed -n 's/^replace \(.*\) => \(.*\) \(v[^ ]*\)$/\1=\2@\3/p' "$SRC/go.mod" | while read -r rule; do
  go mod edit -replace="$rule"
done
grep -q '^replace' go.mod || { log "no replace line read from $SRC/go.mod"; exit 1; }
# The commit behind the version, as the module proxy records it (the module has no .git to ask).
hash=$(go mod download -json "$MODULE@$GPU_SCHEDULER_FUNC" |
  python3 -c 'import json,sys; print(json.load(sys.stdin).get("Origin", {}).get("Hash", "")[:7])')
ldflags="-s -w -X $MODULE/pkg/app.vers=$GPU_SCHEDULER_FUNC -X $MODULE/pkg/app.hash=$hash"
log "$GPU_SCHEDULER_FUNC: go build $MODULE/cmd/func (about 5 minutes on 2 cores, once)"
build_into "$BIN" "$MODULE/cmd/func" "$ldflags"
cd / && rm -rf "$DIR/module"
log "$("$BIN" version) in $((SECONDS - start))s: $BIN"
