#!/usr/bin/env bash
# make deploy: the chart (chart/gpu-scheduler) on the kind cluster, with kind/values.yaml, the
# images `make images` loaded (BIND_IMAGE, MUTATE_IMAGE), and the CA of knative-selfsigned-issuer
# for the sinks; then waits for each piece. `make install` is the same chart for any cluster.
set -euo pipefail
# shellcheck source=kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

step "Prerequisites"
require kubectl helm docker
require_cluster

# image_values KEY IMAGE: the chart's values for one function's image. The image ID (what
# `make images` built and loaded) goes into a pod annotation: a rebuilt image under the same
# :dev tag makes a new revision, whose pods run it; an unchanged one changes nothing.
image_values() {
  local key="$1" image="$2" repository tag id
  repository="${image%:*}"; tag="${image##*:}"
  case "$tag" in */*|"$image") repository="$image"; tag=latest ;; esac  # no tag, or a registry port
  id="$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null)" \
    || die "no image $image here: run 'make images' first"
  printf '%s:\n  image:\n    repository: %s\n    tag: "%s"\n  podAnnotations:\n    gpu-scheduler/image-id: "%s"\n' \
    "$key" "$repository" "$tag" "$id"
}

workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT
{ image_values bind "$BIND_IMAGE"; image_values mutate "$MUTATE_IMAGE"; } > "$workdir/images.yaml"
# The sinks' cluster-local address is https (cluster-local-domain-tls): the adapters must trust
# the CA that signed it, which kind-up made in this cluster.
k -n cert-manager get secret knative-selfsigned-ca -o jsonpath='{.data.ca\.crt}' | base64 -d > "$workdir/ca.crt"
[ -s "$workdir/ca.crt" ] || die "secret cert-manager/knative-selfsigned-ca has no ca.crt: run 'make kind-up'"

step "helm upgrade --install $RELEASE (namespace $NAMESPACE, kind/values.yaml)"
helm --kube-context "$KUBE_CONTEXT" upgrade --install "$RELEASE" "$REPO_ROOT/chart/gpu-scheduler" \
  --namespace "$NAMESPACE" --create-namespace \
  -f "$REPO_ROOT/kind/values.yaml" -f "$workdir/images.yaml" --set-file "sink.caCerts=$workdir/ca.crt" \
  >/dev/null
ok "release $RELEASE installed (helm --kube-context $KUBE_CONTEXT -n $NAMESPACE history $RELEASE)"

step "Knative Services, event sources, webhook"
for ksvc in mutate bind; do
  k -n "$NAMESPACE" wait "ksvc/$ksvc" --for=condition=Ready --timeout=300s >/dev/null \
    || die "Knative Service $ksvc is not Ready: kubectl --context $KUBE_CONTEXT -n $NAMESPACE describe ksvc $ksvc"
  ok "$ksvc is Ready at $(k -n "$NAMESPACE" get ksvc "$ksvc" -o jsonpath='{.status.address.url}')"
done
for source in apiserversource/pod-events pingsource/resync; do
  k -n "$NAMESPACE" wait "$source" --for=condition=Ready --timeout=300s >/dev/null \
    || die "$source is not Ready: kubectl --context $KUBE_CONTEXT -n $NAMESPACE describe $source"
  ok "$source is Ready"
done
ca_bundle_injected() {
  [ -n "$(k get mutatingwebhookconfiguration "$RELEASE" -o jsonpath='{.webhooks[0].clientConfig.caBundle}')" ]
}
wait_until 120 "cert-manager's CA injector to fill caBundle (cert-manager.io/inject-ca-from)" ca_bundle_injected
ok "caBundle injected"

step "Deployed. Next: make check verify"
