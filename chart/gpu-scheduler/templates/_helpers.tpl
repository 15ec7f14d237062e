{{/* The namespace of every namespaced object: namespace.name, else the release's. */}}
{{- define "gpu-scheduler.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{/* Prefix of the cluster-scoped objects (ClusterRoles, their bindings, the webhook
configuration): the release name, with the chart's name unless it already holds it. */}}
{{- define "gpu-scheduler.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Every object's labels. The version is the chart's appVersion, which is pyproject.toml's
version (tests/test_chart.py fails when they drift). */}}
{{- define "gpu-scheduler.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Argo CD's sync wave of an object (argocd/README.md): the namespace and RBAC first, then mutate
and its webhook, then bind and its event sources; the check workload (check/statefulset.yaml) is
wave 3. Argo CD applies a wave once the previous one is healthy; helm and kubectl ignore the
annotation. include "gpu-scheduler.syncWave" "mutate" */}}
{{- define "gpu-scheduler.syncWave" -}}
argocd.argoproj.io/sync-wave: {{ required (printf "no sync wave %q" .) (get (dict "setup" "0" "mutate" "1" "bind" "2") .) | quote }}
{{- end -}}

{{/* image REPOSITORY:TAG of one function: include "gpu-scheduler.image" (list . "bind") */}}
{{- define "gpu-scheduler.image" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $image := (index $root.Values $name).image -}}
{{- $repository := required (printf "%s.image.repository: the image built from Dockerfile.%s, in a registry the nodes pull from" $name $name) $image.repository -}}
{{- printf "%s:%s" $repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end -}}

{{/* The sink both event sources send to: the Knative Service bind. */}}
{{- define "gpu-scheduler.sink" -}}
sink:
  ref:
    {{- if eq .Values.sink.path "direct-service" }}
    # sink.path direct-service: the ClusterIP Service on bind's revision pods (sink-service.yaml).
    apiVersion: v1
    kind: Service
    name: {{ .Values.sink.directService.serviceName }}
    {{- else }}
    apiVersion: serving.knative.dev/v1
    kind: Service
    name: bind
    {{- end }}
    namespace: {{ include "gpu-scheduler.namespace" . }}
  {{- with .Values.sink.caCerts }}
  # The adapters trust this CA for bind's https address (cluster-local-domain-tls).
  CACerts: |
    {{- . | trim | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* What every function container shares: probes on functions-framework's health paths, and a
non-root, read-only container with no capabilities (the images set TMPDIR=/dev/shm for gunicorn). */}}
{{- define "gpu-scheduler.probes" -}}
livenessProbe:
  httpGet:
    path: /health/liveness
readinessProbe:
  httpGet:
    path: /health/readiness
{{- end -}}

{{- define "gpu-scheduler.securityContext" -}}
securityContext:
  runAsNonRoot: true
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/* mutate's environment, for its container and the TLS one of webhook.path direct-service. */}}
{{- define "gpu-scheduler.mutateEnv" -}}
- name: LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: DEVICE_ENV_MODE
  value: {{ .Values.deviceEnvMode | quote }}
- name: GPU_SCHEDULER_QUOTA
  value: {{ .Values.quota.enabled | quote }}
# gunicorn's workers and threads (serving/gunicorn_config.py reads them, as functions-framework does)
- name: WORKERS
  value: {{ .Values.mutate.workers | quote }}
- name: THREADS
  value: {{ .Values.mutate.threads | quote }}
{{- with .Values.mutate.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Knative's scale bounds of one function: include "gpu-scheduler.scale" (list . "bind") */}}
{{- define "gpu-scheduler.scale" -}}
{{- $name := index . 1 -}}
{{- $scale := (index (index . 0).Values $name).scale -}}
{{- if gt (int $scale.min) (int $scale.max) -}}
{{- fail (printf "%s.scale: min %v is above max %v" $name $scale.min $scale.max) -}}
{{- end -}}
autoscaling.knative.dev/min-scale: {{ $scale.min | quote }}
autoscaling.knative.dev/max-scale: {{ $scale.max | quote }}
{{- with $scale.window }}
autoscaling.knative.dev/window: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The resync PingSource's schedule: resync.schedule, or when empty every minute while bind
keeps a pod and every 5 minutes at bind.scale.min 0 (a ping a minute would keep bind awake). */}}
{{- define "gpu-scheduler.resyncSchedule" -}}
{{- if .Values.resync.schedule -}}
{{- .Values.resync.schedule -}}
{{- else if eq (int .Values.bind.scale.min) 0 -}}
*/5 * * * *
{{- else -}}
* * * * *
{{- end -}}
{{- end -}}


{{/* The pod-level settings of one kind of pod, from its values (bind, mutate, test):
imagePullSecrets, priorityClassName, nodeSelector, tolerations, affinity; nothing for what is
empty. include "gpu-scheduler.podSettings" .Values.bind */}}
{{- define "gpu-scheduler.podSettings" -}}
{{- with .imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* bind's environment, in either runtime. */}}
{{- define "gpu-scheduler.bindEnv" -}}
{{- /* bind refuses this pair at start (functions/bind/config.py): refused here, before an install whose every pod would wait */}}
{{- if and (eq .Values.deviceEnvMode "dra") (not .Values.dra.enabled) -}}
{{- fail "deviceEnvMode dra needs dra.enabled true (bind watches ResourceClaims and ResourceSlices only then): set dra.enabled=true, or deviceEnvMode cuda or nvidia" -}}
{{- end -}}
- name: LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: RESYNC_CONCURRENCY
  value: {{ .Values.bind.resyncConcurrency | quote }}
- name: THREADS
  value: {{ .Values.bind.threads | quote }}
- name: GPU_SCHEDULER_QUOTA
  value: {{ .Values.quota.enabled | quote }}
- name: GPU_SCHEDULER_DRA
  value: {{ .Values.dra.enabled | quote }}
{{- /* mutate's default device env mode: in dra, bind is not ready where resource.k8s.io/v1 is not served */}}
- name: DEVICE_ENV_MODE
  value: {{ .Values.deviceEnvMode | quote }}
- name: GPU_SCHEDULER_DRA_DEVICE_CLASS
  value: {{ .Values.dra.deviceClass | quote }}
{{- with .Values.dra.deviceRules }}
- name: GPU_SCHEDULER_DRA_DEVICE_RULES
  value: {{ . | quote }}
{{- end }}
{{- with .Values.bind.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The labels a Deployment of runtime deployments selects its pods by: include
"gpu-scheduler.selectorLabels" (list . "bind") */}}
{{- define "gpu-scheduler.selectorLabels" -}}
app.kubernetes.io/name: {{ (index . 0).Chart.Name }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The pod's own securityContext outside Knative: the images' numeric USER (65532:65532). Without
runAsUser and runAsGroup the kubelet passes containerd only the image's uid, and the process runs
with group 0 (localcp/incluster.py). */}}
{{- define "gpu-scheduler.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/* runtime deployments: the kubelet's probes on functions-framework's health paths (httpGet):
include "gpu-scheduler.deploymentProbes" (list . "HTTPS" "https" 8443). Readiness every 5 s, failing
at once: a SIGTERM's drain (15 s, serving/gunicorn_config.py) takes the pod out of the endpoints
well before it stops. */}}
{{- define "gpu-scheduler.deploymentProbes" -}}
{{- $scheme := index . 1 -}}
{{- range $probe := list (list "readinessProbe" "/health/readiness" 5 1) (list "livenessProbe" "/health/liveness" 10 3) }}
{{ index $probe 0 }}:
  httpGet:
    path: {{ index $probe 1 }}
    port: {{ index $ 2 }}
    scheme: {{ $scheme }}
  periodSeconds: {{ index $probe 2 }}
  timeoutSeconds: 3
  failureThreshold: {{ index $probe 3 }}
{{- end }}
{{- end -}}

{{/* runtime deployments: "true" when mutate's certificate comes from cert-manager
(webhook.certManager true, or auto and the cluster serves cert-manager.io/v1), else "false". */}}
{{- define "gpu-scheduler.certManager" -}}
{{- $setting := .Values.webhook.certManager -}}
{{- if eq (toString $setting) "auto" -}}
{{- .Capabilities.APIVersions.Has "cert-manager.io/v1" -}}
{{- else -}}
{{- $setting -}}
{{- end -}}
{{- end -}}

{{/* "true" when mutate's own TLS certificate comes from cert-manager: runtime deployments as
gpu-scheduler.certManager says; webhook.path direct-service likewise, and always when an issuer
is named (webhook.directService.issuerRef is a cert-manager issuer: with certManager false, an
error that names both). */}}
{{- define "gpu-scheduler.ownTLSFromCertManager" -}}
{{- if and (eq .Values.runtime "knative") .Values.webhook.directService.issuerRef -}}
{{- if eq (toString .Values.webhook.certManager) "false" -}}
{{- fail "webhook.directService.issuerRef names a cert-manager issuer, but webhook.certManager is false: remove the issuerRef (the chart's own CA signs mutate's certificate) or set webhook.certManager to true or auto" -}}
{{- end -}}
true
{{- else -}}
{{- include "gpu-scheduler.certManager" . -}}
{{- end -}}
{{- end -}}
