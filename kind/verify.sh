#!/usr/bin/env bash
# make verify: check each link of the chain separately, so a failure names the broken link:
#   nodes -> API server DNS -> issuer -> cluster-local TLS -> Knative Service mutate -> its
#   certificate -> caBundle -> the webhook call -> event sources -> a test pod gets its env
#   (mutate) and its node (ApiServerSource -> bind).
# Runs every check, prints PASS/FAIL with what to look at, exits 1 if any failed.
set -euo pipefail
# shellcheck source=kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

step "Prerequisites"
require kubectl kn python3
require_cluster

FAILED=0
pass() { printf 'PASS %s\n' "$*"; }
fail() { printf 'FAIL %s\n' "$1"; shift; for hint in "$@"; do printf '     -> %s\n' "$hint"; done; FAILED=$((FAILED + 1)); }
kc="kubectl --context $KUBE_CONTEXT"
json() { python3 -c "import json,sys; data=json.load(sys.stdin); $1"; }

step "1. Nodes"
for node in node1 node2 node3 node4; do
  if [ "$(k get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; then
    pass "node $node is Ready"
  else
    fail "node $node is missing or not Ready" "$kc get nodes; the JoinConfiguration patches in kind/cluster.yaml name the workers"
  fi
done

step "2. The API server resolves kourier-internal.kourier-system.svc.cluster.local"
policy="$(k -n kube-system get pod "kube-apiserver-$CONTROL_PLANE" -o jsonpath='{.spec.dnsPolicy}' 2>/dev/null || true)"
if [ "$policy" = ClusterFirstWithHostNet ]; then
  pass "kube-apiserver has dnsPolicy ClusterFirstWithHostNet"
else
  fail "kube-apiserver has dnsPolicy '${policy:-?}', so it cannot resolve cluster names" \
    "rerun make kind-up (it applies kind/patches/kube-apiserver+strategic.yaml with kubeadm)"
fi
# Resolve the name exactly as the API server does: a hostNetwork pod on the control-plane node
# with the same dnsPolicy (namespace gpu-scheduler: the webhook never sees it).
k -n "$NAMESPACE" delete pod gpu-scheduler-dns-probe --ignore-not-found --wait=true >/dev/null
k apply -f - >/dev/null <<PROBE
apiVersion: v1
kind: Pod
metadata:
  name: gpu-scheduler-dns-probe
  namespace: $NAMESPACE
spec:
  nodeName: $CONTROL_PLANE
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  restartPolicy: Never
  automountServiceAccountToken: false
  tolerations:
    - operator: Exists
  containers:
    - name: probe
      image: $CHECK_IMAGE
      imagePullPolicy: IfNotPresent
      command: ["python", "-c", "import socket; print(socket.gethostbyname('kourier-internal.kourier-system.svc.cluster.local'))"]
      securityContext:
        runAsNonRoot: true
        allowPrivilegeEscalation: false
        capabilities:
          drop: ["ALL"]
PROBE
probe_done() { case "$(k -n "$NAMESPACE" get pod gpu-scheduler-dns-probe -o jsonpath='{.status.phase}')" in Succeeded|Failed) return 0 ;; *) return 1 ;; esac; }
if (wait_until 90 "the DNS probe pod" probe_done); then
  resolved="$(k -n "$NAMESPACE" logs gpu-scheduler-dns-probe 2>&1 | tail -n1)"
  cluster_ip="$(k -n kourier-system get service kourier-internal -o jsonpath='{.spec.clusterIP}' 2>/dev/null || true)"
  if [ -n "$cluster_ip" ] && [ "$resolved" = "$cluster_ip" ]; then
    pass "from the control-plane node's network, kourier-internal resolves to its ClusterIP $cluster_ip"
  else
    fail "kourier-internal resolved to '$resolved', its ClusterIP is '${cluster_ip:-<no Service>}'" \
      "$kc -n kube-system get pods -l k8s-app=kube-dns (CoreDNS must run)" \
      "$kc -n kourier-system get service kourier-internal (Kourier must be installed: make kind-up)"
  fi
else
  fail "the DNS probe pod did not finish" "$kc -n $NAMESPACE describe pod gpu-scheduler-dns-probe (is $CHECK_IMAGE loaded? make images)"
fi
k -n "$NAMESPACE" delete pod gpu-scheduler-dns-probe --ignore-not-found --wait=false >/dev/null

step "3. cert-manager issuer and Knative's cluster-local TLS"
if [ "$(k get clusterissuer knative-selfsigned-issuer -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; then
  pass "ClusterIssuer knative-selfsigned-issuer is Ready"
else
  fail "ClusterIssuer knative-selfsigned-issuer is not Ready" "$kc describe clusterissuer knative-selfsigned-issuer" "$kc -n cert-manager describe certificate knative-selfsigned-ca"
fi
if [ "$(k -n knative-serving get configmap config-network -o jsonpath='{.data.cluster-local-domain-tls}' 2>/dev/null)" = Enabled ]; then
  pass "config-network: cluster-local-domain-tls is Enabled"
else
  fail "cluster-local-domain-tls is not Enabled" "rerun make kind-up; then $kc -n knative-serving rollout restart deployment/controller"
fi

step "4. Knative Service mutate"
if [ "$(k -n "$NAMESPACE" get ksvc mutate -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; then
  pass "ksvc mutate is Ready"
else
  fail "ksvc mutate is not Ready" "kn service describe mutate -n $NAMESPACE" "$kc -n $NAMESPACE get pods; make deploy"
fi
url="$(k -n "$NAMESPACE" get ksvc mutate -o jsonpath='{.status.address.url}' 2>/dev/null || true)"
if [ "$url" = "https://mutate.$NAMESPACE.svc.cluster.local" ]; then
  pass "mutate's cluster-local address is $url"
else
  fail "mutate's cluster-local address is '${url:-<none>}', not https://mutate.$NAMESPACE.svc.cluster.local" \
    "http means cluster-local-domain-tls is off or its certificate is not ready (step 3, step 5)"
fi
external="$(k -n "$NAMESPACE" get service mutate -o jsonpath='{.spec.type} {.spec.externalName}' 2>/dev/null || true)"
if [ "$external" = "ExternalName kourier-internal.kourier-system.svc.cluster.local" ]; then
  pass "Service $NAMESPACE/mutate is an ExternalName for kourier-internal"
else
  fail "Service $NAMESPACE/mutate is '${external:-missing}'" "the webhook's service reference needs Knative's Service for a Ready cluster-local ksvc"
fi

step "5. mutate's certificate"
certificates="$(k -n "$NAMESPACE" get certificates.cert-manager.io -o json 2>/dev/null || echo '{"items": []}')"
wanted="mutate.$NAMESPACE mutate.$NAMESPACE.svc mutate.$NAMESPACE.svc.cluster.local"
certificate="$(printf '%s' "$certificates" | json "
wanted = set('$wanted'.split())
for c in data['items']:
    if wanted <= set(c['spec'].get('dnsNames', [])):
        ready = [x['status'] for x in c.get('status', {}).get('conditions', []) if x['type'] == 'Ready']
        print(c['metadata']['name'], ready[0] if ready else 'Unknown'); break")"
case "$certificate" in
  *" True") pass "certificate ${certificate% *} is Ready for $wanted" ;;
  "") fail "no cert-manager Certificate in $NAMESPACE has the SANs $wanted" \
        "$kc -n $NAMESPACE get certificates.networking.internal.knative.dev,certificates.cert-manager.io" \
        "config-certmanager must name clusterLocalIssuerRef knative-selfsigned-issuer (make kind-up)" ;;
  *) fail "certificate ${certificate% *} has the SANs but is not Ready" "$kc -n $NAMESPACE describe certificate ${certificate% *}" ;;
esac

step "6. caBundle of the MutatingWebhookConfiguration"
bundle="$(k get mutatingwebhookconfiguration gpu-scheduler -o jsonpath='{.webhooks[0].clientConfig.caBundle}' 2>/dev/null || true)"
ca="$(k -n cert-manager get secret knative-selfsigned-ca -o jsonpath='{.data.ca\.crt}' 2>/dev/null || true)"
if [ -z "$bundle" ]; then
  fail "caBundle is empty: cert-manager's CA injector did not fill it" \
    "$kc get mutatingwebhookconfiguration gpu-scheduler -o yaml (annotation cert-manager.io/inject-ca-from)" \
    "$kc -n cert-manager logs deploy/cert-manager-cainjector"
elif [ "$(printf '%s' "$bundle" | base64 -d 2>/dev/null)" = "$(printf '%s' "$ca" | base64 -d 2>/dev/null)" ]; then
  pass "caBundle is the CA of knative-selfsigned-issuer"
else
  fail "caBundle is not the CA in secret cert-manager/knative-selfsigned-ca" "was the CA re-created? rerun make deploy"
fi

step "7. The API server calls mutate (server-side dry run of an annotated pod)"
probe_pod() {  # probe_pod NAME MAP: an annotated pod for the default namespace, as JSON
  printf '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s","namespace":"default","annotations":{"gpu-scheduling-map":"%s"}},"spec":{"schedulerName":"gpu-scheduler","restartPolicy":"Never","terminationGracePeriodSeconds":1,"containers":[{"name":"check","image":"%s","imagePullPolicy":"IfNotPresent","securityContext":{"runAsNonRoot":true,"runAsUser":65532,"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}}]}}' "$1" "$2" "$CHECK_IMAGE"
}
k -n default delete pod gpu-scheduler-verify-0 --ignore-not-found --wait=true >/dev/null
if dry="$(probe_pod gpu-scheduler-verify-0 '0=node2:1' | k create --dry-run=server -o json -f - 2>&1)"; then
  env="$(printf '%s' "$dry" | json "print([e.get('value') for e in data['spec']['containers'][0].get('env', []) if e['name'] == 'CUDA_VISIBLE_DEVICES'])")"
  if [ "$env" = "['1']" ]; then
    pass "mutate answered: CUDA_VISIBLE_DEVICES=1 added"
  else
    fail "the pod was admitted without CUDA_VISIBLE_DEVICES (env: $env)" \
      "matchConditions/namespaceSelector skipped it, or mutate declined: $kc -n $NAMESPACE logs -l serving.knative.dev/service=mutate -c mutate"
  fi
else
  case "$dry" in
    *"no such host"*|*"lookup "*) hint="the API server cannot resolve the gateway name (step 2)" ;;
    *x509*|*certificate*) hint="TLS: the caBundle (step 6) does not verify the certificate Kourier serves for mutate.$NAMESPACE.svc (step 5)" ;;
    *"connection refused"*|*"no endpoints"*) hint="nothing listens behind kourier-internal: $kc -n kourier-system get pods" ;;
    *"deadline exceeded"*|*"timeout"*|*Timeout*) hint="mutate did not answer within 5 s: $kc -n $NAMESPACE get pods (min-scale 1?)" ;;
    *"404"*|*"503"*|*"502"*) hint="Kourier has no route for Host mutate.$NAMESPACE.svc: kn service describe mutate -n $NAMESPACE" ;;
    *) hint="read the API server's message above" ;;
  esac
  fail "the webhook call failed: $(printf '%s' "$dry" | tail -n1)" "$hint"
fi

step "8. Event sources"
for source in apiserversource/pod-events pingsource/resync; do
  ready="$(k -n "$NAMESPACE" get "$source" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)"
  sink="$(k -n "$NAMESPACE" get "$source" -o jsonpath='{.status.sinkUri}' 2>/dev/null || true)"
  if [ "$ready" = True ] && [[ "$sink" == *"bind.$NAMESPACE"* ]]; then
    pass "$source is Ready, sink $sink"
  else
    fail "$source is not Ready (Ready=${ready:-?}, sink '${sink:-none}')" \
      "kn source list -n $NAMESPACE; $kc -n $NAMESPACE describe $source" \
      "ApiServerSource: the pod-events account needs get/list/watch pods cluster-wide (chart/gpu-scheduler/templates/rbac.yaml)"
  fi
done

step "9. A test pod gets its env (mutate) and its node (ApiServerSource -> bind)"
if created="$(probe_pod gpu-scheduler-verify-0 '0=node2:1' | k create -f - 2>&1)"; then
  env="$(k -n default get pod gpu-scheduler-verify-0 -o jsonpath='{.spec.containers[0].env[?(@.name=="CUDA_VISIBLE_DEVICES")].value}')"
  if [ "$env" = 1 ]; then
    pass "test pod has CUDA_VISIBLE_DEVICES=1"
  else
    fail "test pod has CUDA_VISIBLE_DEVICES='$env', want 1" "see step 7"
  fi
  bound_to_node2() { [ "$(k -n default get pod gpu-scheduler-verify-0 -o jsonpath='{.spec.nodeName}')" = node2 ]; }
  if (wait_until 90 "the test pod to be bound to node2" bound_to_node2); then
    pass "test pod was bound to node2"
  else
    fail "test pod was not bound to node2 within 90 s (nodeName '$(k -n default get pod gpu-scheduler-verify-0 -o jsonpath='{.spec.nodeName}')')" \
      "$kc -n default describe pod gpu-scheduler-verify-0 (events from gpu-scheduler say why)" \
      "$kc -n $NAMESPACE logs -l serving.knative.dev/service=bind -c bind (did an event arrive?)" \
      "$kc -n $NAMESPACE logs -l eventing.knative.dev/sourceName=pod-events (the adapter)"
  fi
else
  fail "the test pod was refused: $(printf '%s' "$created" | tail -n1)" "see step 7"
fi
k -n default delete pod gpu-scheduler-verify-0 --ignore-not-found --wait=false >/dev/null

echo
if [ "$FAILED" -eq 0 ]; then
  echo "All links verified."
else
  die "$FAILED check(s) failed; the first FAIL above is the link to fix first (docs/kind.md, Troubleshooting)"
fi
