#!/usr/bin/env bash
# make check: run the test StatefulSet (check/statefulset.yaml, the seed map), wait for its five
# pods, and write what happened to kind/check-output.txt: every pod with its node, and the logs
# of the check pods on node3 and node4. Fails when a pod is not where the map puts it.
set -euo pipefail
# shellcheck source=kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUTPUT="${CHECK_OUTPUT:-$REPO_ROOT/kind/check-output.txt}"
STS=gpu-scheduler-check
STS_NAMESPACE=default

step "Prerequisites"
require kubectl
require_cluster

step "StatefulSet $STS_NAMESPACE/$STS"
k apply -f "$REPO_ROOT/check/statefulset.yaml"
k -n "$STS_NAMESPACE" rollout status "statefulset/$STS" --timeout=300s \
  || die "the check pods did not all start: kubectl --context $KUBE_CONTEXT -n $STS_NAMESPACE get pods -owide; then make verify"

# The map from the object in the cluster: "index=node:devices" per line.
map="$(k -n "$STS_NAMESPACE" get "statefulset/$STS" -o jsonpath='{.spec.template.metadata.annotations.gpu-scheduling-map}')"

logs_of() { k -n "$STS_NAMESPACE" logs "$1" --tail=3; }
has_logged() { [ -n "$(logs_of "$1" 2>/dev/null)" ]; }
# The program logs every CHECK_INTERVAL_SECONDS (5 s): wait for a first line from each pod.
for pod in $(k -n "$STS_NAMESPACE" get pods -l app="$STS" -o jsonpath='{.items[*].metadata.name}'); do
  wait_until 60 "a log line from $pod" has_logged "$pod"
done

step "Writing $OUTPUT"
failures=0
{
  echo "# make check: $(date -u +%Y-%m-%dT%H:%M:%SZ), cluster $KUBE_CONTEXT"
  echo
  echo "## kubectl get pod -owide -A"
  k get pod -owide -A
  echo
  echo "## logs of the check pods on node3 and node4"
  for node in node3 node4; do
    for pod in $(k -n "$STS_NAMESPACE" get pods -l app="$STS" --field-selector "spec.nodeName=$node" -o jsonpath='{.items[*].metadata.name}'); do
      echo "### $STS_NAMESPACE/$pod on $node"
      logs_of "$pod"
    done
  done
  echo
  echo "## expected (gpu-scheduling-map) vs actual"
  while IFS= read -r entry; do
    entry="$(printf '%s' "$entry" | tr -d '[:space:]')"
    [ -n "$entry" ] || continue
    index="${entry%%=*}"; placement="${entry#*=}"
    node="${placement%%:*}"; devices="${placement#*:}"
    pod="$STS-$index"
    actual_node="$(k -n "$STS_NAMESPACE" get pod "$pod" -o jsonpath='{.spec.nodeName}')"
    line="$(logs_of "$pod" | tail -n1)"
    if [ "$actual_node" = "$node" ] && [ "$line" = "node=$node CUDA_VISIBLE_DEVICES=$devices" ]; then
      echo "PASS $pod: $line"
    else
      echo "FAIL $pod: expected node=$node CUDA_VISIBLE_DEVICES=$devices, got nodeName=${actual_node:-<none>} log '${line}'"
      failures=$((failures + 1))
    fi
  done <<< "$map"
} > "$OUTPUT"
cat "$OUTPUT"
[ "$failures" -eq 0 ] || die "$failures pod(s) not placed as the map says; see $OUTPUT and run make verify"
ok "all pods placed as the map says"
