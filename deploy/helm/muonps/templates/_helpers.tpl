{{/* Names and labels. */}}
{{- define "muonps.name" -}}
{{- default "muonps" .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "muonps.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "muonps.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "muonps.selectorLabels" -}}
app.kubernetes.io/name: {{ include "muonps.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "muonps.labels" -}}
{{ include "muonps.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: muonps
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The label every pod that may talk to this release's coordinator carries
(trainer pods with a sidecar worker, pool workers). */}}
{{- define "muonps.memberLabel" -}}
muonps.io/member: {{ include "muonps.fullname" . }}
{{- end -}}

{{/* image: (dict "ctx" $ "role" "coordinator"|"worker") */}}
{{- define "muonps.image" -}}
{{- $img := index .ctx.Values.image .role -}}
{{- $repo := $img.repository -}}
{{- if .ctx.Values.image.registry -}}{{- $repo = printf "%s/%s" .ctx.Values.image.registry $img.repository -}}{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .ctx.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the /metrics bearer token (key "token"). */}}
{{- define "muonps.metricsTokenSecret" -}}
{{- .Values.metrics.tokenSecret | default (printf "%s-metrics-token" (include "muonps.fullname" .)) -}}
{{- end -}}

{{- define "muonps.coordinatorAddress" -}}
{{- if .Values.workers.sidecar.coordinatorAddress -}}
{{- .Values.workers.sidecar.coordinatorAddress -}}
{{- else -}}
{{- printf "%s-coordinator.%s.svc:%d" (include "muonps.fullname" .) .Release.Namespace (int .Values.coordinator.port) -}}
{{- end -}}
{{- end -}}

{{/* Settings the chart cannot express in values.schema.json: fails with a
message naming the value. */}}
{{- define "muonps.validate" -}}
{{- if .Values.tls.enabled -}}
{{- fail "tls.enabled: TLS is not implemented in muonps yet (issue 16); the coordinator and workers listen in plaintext. Leave tls.enabled false." -}}
{{- end -}}
{{- if .Values.auth.enabled -}}
{{- fail "auth.enabled: bearer tokens are not implemented in muonps yet (issue 16). Leave auth.enabled false." -}}
{{- end -}}
{{- if ge (int .Values.coordinator.heartbeatIntervalMs) (int .Values.coordinator.leaseTtlMs) -}}
{{- fail (printf "coordinator.heartbeatIntervalMs (%v) must be below coordinator.leaseTtlMs (%v), or every lease expires between heartbeats" .Values.coordinator.heartbeatIntervalMs .Values.coordinator.leaseTtlMs) -}}
{{- end -}}
{{- if eq (int .Values.coordinator.port) (int .Values.coordinator.metricsPort) -}}
{{- fail "coordinator.port and coordinator.metricsPort must differ" -}}
{{- end -}}
{{- if eq (int .Values.workers.dataPort) (int .Values.workers.metricsPort) -}}
{{- fail "workers.dataPort and workers.metricsPort must differ" -}}
{{- end -}}
{{- if and .Values.workers.pool.enabled (eq .Values.workers.pool.device "cuda") (empty .Values.workers.pool.colocateWith) -}}
{{- fail "workers.pool.colocateWith: a GPU pool talks to the job's other workers by CUDA IPC, so it must run on the trainers' node; give the trainer pods' labels, e.g. {app: my-trainer}" -}}
{{- end -}}
{{- end -}}

{{/* Environment common to worker containers: pod identity and NCCL. */}}
{{- define "muonps.worker.env" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: NCCL_NVLS_ENABLE
  value: {{ ternary "1" "0" .Values.workers.nccl.nvlsEnable | quote }}
{{- with .Values.workers.nccl.socketIfname }}
- name: NCCL_SOCKET_IFNAME
  value: {{ . | quote }}
{{- end }}
{{- with .Values.workers.nccl.debug }}
- name: NCCL_DEBUG
  value: {{ . | quote }}
{{- end }}
{{- range $k, $v := .Values.workers.nccl.extraEnv }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{- define "muonps.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
