#!/usr/bin/env bash
# make kind-up: the kind cluster (kind/cluster.yaml), the API server's cluster DNS, cert-manager
# with Knative's self-signed CA, Knative Serving + Kourier (domain 127.0.0.1.sslip.io, as the
# quickstart sets it up) with cluster-local-domain-tls, and Knative Eventing. Idempotent: a
# second run reuses the cluster and re-applies the same release manifests.
set -euo pipefail
# shellcheck source=kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SERVING_URL="https://github.com/knative/serving/releases/download/${SERVING_VERSION}"
KOURIER_URL="https://github.com/knative/net-kourier/releases/download/${KOURIER_VERSION}"
EVENTING_URL="https://github.com/knative/eventing/releases/download/${EVENTING_VERSION}"
CERT_MANAGER_URL="https://github.com/cert-manager/cert-manager/releases/download/${CERT_MANAGER_VERSION}/cert-manager.yaml"

step "Prerequisites"
require docker kind kubectl

step "kind cluster '$KIND_CLUSTER'"
if kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
  ok "exists; reused (make down to start over)"
else
  kind create cluster --name "$KIND_CLUSTER" --config "$REPO_ROOT/kind/cluster.yaml" --wait 300s
fi
k get --raw=/readyz >/dev/null || die "the API server does not answer on context $KUBE_CONTEXT"
for node in node1 node2 node3 node4; do
  k get node "$node" >/dev/null 2>&1 || die "node $node is missing: the JoinConfiguration patches in kind/cluster.yaml did not apply"
done
ok "nodes node1..node4 registered"

step "API server resolves cluster DNS names (kind/patches/kube-apiserver+strategic.yaml)"
apiserver_pod="kube-apiserver-${CONTROL_PLANE}"
apiserver_uses_cluster_dns() {
  [ "$(k -n kube-system get pod "$apiserver_pod" -o jsonpath='{.spec.dnsPolicy}')" = ClusterFirstWithHostNet ] \
    && k get --raw=/readyz
}
if apiserver_uses_cluster_dns >/dev/null 2>&1; then
  ok "already ClusterFirstWithHostNet"
else
  # kind writes its kubeadm configuration to /kind/kubeadm.conf in each node; regenerating only
  # the API server's static pod manifest from it, with the patch, changes nothing but dnsPolicy.
  docker exec "$CONTROL_PLANE" mkdir -p /kind/patches
  docker cp "$REPO_ROOT/kind/patches/kube-apiserver+strategic.yaml" "$CONTROL_PLANE:/kind/patches/kube-apiserver+strategic.yaml"
  docker exec "$CONTROL_PLANE" kubeadm init phase control-plane apiserver \
      --config /kind/kubeadm.conf --patches /kind/patches \
    || die "kubeadm could not regenerate the API server manifest; see docs/kind.md, 'The API server cannot resolve kourier-internal'"
  # The kubelet notices the changed manifest and restarts the static pod.
  wait_until 300 "kube-apiserver to restart with dnsPolicy ClusterFirstWithHostNet" apiserver_uses_cluster_dns
  ok "kube-apiserver restarted with dnsPolicy ClusterFirstWithHostNet"
fi

step "cert-manager $CERT_MANAGER_VERSION"
retry 3 k apply -f "$CERT_MANAGER_URL" >/dev/null
wait_deployments cert-manager
# cert-manager's webhook can be Available a moment before it serves: retry the first apply.
retry 12 k apply -f "$REPO_ROOT/kind/cert-manager-issuers.yaml" >/dev/null
k -n cert-manager wait --for=condition=Ready certificate/knative-selfsigned-ca --timeout=180s >/dev/null \
  || die "the CA certificate cert-manager/knative-selfsigned-ca is not Ready: kubectl --context $KUBE_CONTEXT -n cert-manager describe certificate knative-selfsigned-ca"
k wait --for=condition=Ready clusterissuer/knative-selfsigned-issuer --timeout=180s >/dev/null \
  || die "ClusterIssuer knative-selfsigned-issuer is not Ready: kubectl --context $KUBE_CONTEXT describe clusterissuer knative-selfsigned-issuer"
ok "ClusterIssuer knative-selfsigned-issuer is Ready"

step "Knative Serving $SERVING_VERSION"
retry 3 k apply -f "$SERVING_URL/serving-crds.yaml" >/dev/null
k wait --for=condition=Established crd --all --timeout=120s >/dev/null
retry 3 k apply -f "$SERVING_URL/serving-core.yaml" >/dev/null
wait_deployments knative-serving

step "Kourier $KOURIER_VERSION, domain 127.0.0.1.sslip.io"
retry 3 k apply -f "$KOURIER_URL/kourier.yaml" >/dev/null
wait_deployments kourier-system
retry 6 k -n knative-serving patch configmap/config-network --type merge \
  -p '{"data":{"ingress-class":"kourier.ingress.networking.knative.dev"}}' >/dev/null
k apply -f "$REPO_ROOT/kind/kourier-nodeport.yaml" >/dev/null
retry 6 k -n knative-serving patch configmap/config-domain --type merge \
  -p '{"data":{"127.0.0.1.sslip.io":""}}' >/dev/null
ok "ingress-class kourier, NodePort 31080 -> host port 80, domain 127.0.0.1.sslip.io"

step "cluster-local-domain-tls with cert-manager's knative-selfsigned-issuer"
# knative.dev/docs/serving/encryption/cluster-local-domain-tls and configure-certmanager-integration:
# name the issuer in config-certmanager, enable the feature in config-network, then restart the
# Serving controller so that it starts its cert-manager integration.
retry 6 k -n knative-serving patch configmap/config-certmanager --type merge \
  -p '{"data":{"clusterLocalIssuerRef":"kind: ClusterIssuer\nname: knative-selfsigned-issuer\n"}}' >/dev/null
retry 6 k -n knative-serving patch configmap/config-network --type merge \
  -p '{"data":{"cluster-local-domain-tls":"Enabled"}}' >/dev/null
k -n knative-serving rollout restart deployment/controller >/dev/null
k -n knative-serving rollout status deployment/controller --timeout=300s >/dev/null
wait_deployments knative-serving
ok "cluster-local-domain-tls Enabled"

step "Knative Eventing $EVENTING_VERSION"
retry 3 k apply -f "$EVENTING_URL/eventing-crds.yaml" >/dev/null
k wait --for=condition=Established crd --all --timeout=120s >/dev/null
retry 3 k apply -f "$EVENTING_URL/eventing-core.yaml" >/dev/null
wait_deployments knative-eventing

step "Ready: kind cluster '$KIND_CLUSTER' (context $KUBE_CONTEXT). Next: make images deploy"
