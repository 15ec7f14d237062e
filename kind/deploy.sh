#!/usr/bin/env bash
# make deploy: namespace and RBAC, the two functions (func deploy of the images `make images`
# loaded, or kubectl apply of knative/*-service.yaml with DEPLOY_WITH=kubectl), the event
# sources with the CA their sinks need, and the webhook registration last.
set -euo pipefail
# shellcheck source=kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DEPLOY_WITH="${DEPLOY_WITH:-func}"   # func | kubectl

step "Prerequisites"
case "$DEPLOY_WITH" in
  func) require kubectl func ;;
  kubectl) require kubectl ;;
  *) die "DEPLOY_WITH is '$DEPLOY_WITH': use func or kubectl" ;;
esac
require_cluster

step "Namespace $NAMESPACE and least-privilege RBAC"
k apply -f "$REPO_ROOT/knative/namespace.yaml" -f "$REPO_ROOT/knative/rbac.yaml"

deploy_function() {  # deploy_function NAME IMAGE
  local name="$1" image="$2"
  step "Knative Service $name ($image, with $DEPLOY_WITH)"
  if [ "$DEPLOY_WITH" = func ]; then
    # func reads functions/$name/func.yaml (env, account, scale, visibility label, probes);
    # no build, no push: the image is already in every node.
    (cd "$REPO_ROOT/functions/$name" \
      && func deploy --build=false --push=false --image "$image" --namespace "$NAMESPACE")
  else
    k apply -f "$REPO_ROOT/knative/$name-service.yaml"
  fi
  k -n "$NAMESPACE" wait "ksvc/$name" --for=condition=Ready --timeout=300s >/dev/null \
    || die "Knative Service $name is not Ready: kubectl --context $KUBE_CONTEXT -n $NAMESPACE describe ksvc $name"
  # The tag does not change when `make images` rebuilds, so the revision does not either:
  # restart its pods (rolling, never below min-scale) to run the image just loaded. Knative
  # leaves the restart annotation alone: it only reverts fields it sets itself.
  local revision deployment
  revision="$(k -n "$NAMESPACE" get ksvc "$name" -o jsonpath='{.status.latestReadyRevisionName}')"
  for deployment in $(k -n "$NAMESPACE" get deployment -l "serving.knative.dev/revision=$revision" -o name); do
    k -n "$NAMESPACE" rollout restart "$deployment" >/dev/null
    k -n "$NAMESPACE" rollout status "$deployment" --timeout=300s >/dev/null \
      || die "the pods of $name did not restart: kubectl --context $KUBE_CONTEXT -n $NAMESPACE get pods"
  done
  ok "$name is Ready at $(k -n "$NAMESPACE" get ksvc "$name" -o jsonpath='{.status.address.url}')"
}
deploy_function mutate "$MUTATE_IMAGE"
deploy_function bind "$BIND_IMAGE"

step "Event sources: ApiServerSource pod-events, PingSource resync -> bind"
k apply -f "$REPO_ROOT/knative/sources.yaml"
# The sink's cluster-local address is https (cluster-local-domain-tls): the adapters must trust
# the CA that signed it. The PEM cannot live in the manifest (the CA is made per cluster).
ca_pem="$(k -n cert-manager get secret knative-selfsigned-ca -o jsonpath='{.data.ca\.crt}' | base64 -d)"
[ -n "$ca_pem" ] || die "secret cert-manager/knative-selfsigned-ca has no ca.crt: run 'make kind-up'"
ca_patch="$(printf 'spec:\n  sink:\n    CACerts: |\n%s\n' "$(printf '%s\n' "$ca_pem" | sed 's/^/      /')")"
k -n "$NAMESPACE" patch apiserversource/pod-events --type merge -p "$ca_patch" >/dev/null
k -n "$NAMESPACE" patch pingsource/resync --type merge -p "$ca_patch" >/dev/null
for source in apiserversource/pod-events pingsource/resync; do
  k -n "$NAMESPACE" wait "$source" --for=condition=Ready --timeout=300s >/dev/null \
    || die "$source is not Ready: kubectl --context $KUBE_CONTEXT -n $NAMESPACE describe $source"
  ok "$source is Ready"
done

step "MutatingWebhookConfiguration gpu-scheduler"
k apply -f "$REPO_ROOT/knative/webhook.yaml"
ca_bundle_injected() {
  [ -n "$(k get mutatingwebhookconfiguration gpu-scheduler -o jsonpath='{.webhooks[0].clientConfig.caBundle}')" ]
}
wait_until 120 "cert-manager's CA injector to fill caBundle (cert-manager.io/inject-ca-from)" ca_bundle_injected
ok "caBundle injected"

step "Deployed. Next: make check verify"
