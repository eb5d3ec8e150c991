{{/*
Sidecar mode: named templates a trainer chart includes to put a muonps-worker
beside its trainer container. Each takes a dict:
  root:   the including chart's top context ($)
  muonps: $.Subcharts.muonps when muonps is a dependency of the including
          chart (its values and appVersion); omit when including from muonps
  job:    the job name (default: workers.job)
The worker and the trainer both get the release's credentials, read-only
under /etc/muonps/ (ca/ca.crt, token/token, client-tls/ under mutual TLS):
the worker as flags, the trainer as MUONPS_TLS_CA_FILE, MUONPS_TOKEN_FILE
(and MUONPS_TLS_CERT_FILE/KEY) through "muonps.trainer.env" and
"muonps.trainer.volumeMounts".
With workers.costTable the worker gets --cost_table: a configMap table is
mounted by "muonps.worker.volumes" and "muonps.worker.container"; with
autotune.shapes the pod also needs "muonps.worker.initContainers" (empty
otherwise), which measures the worker's GPU before the trainer and the
worker start.
Example (a trainer chart's pod template):
  {{- $m := dict "root" $ "muonps" $.Subcharts.muonps "job" "llama-7b" }}
  metadata:
    labels: {{- include "muonps.worker.podLabels" $m | nindent 6 }}
  spec:
    {{- include "muonps.worker.podSpec" $m | nindent 4 }}
    {{- with include "muonps.worker.initContainers" $m }}
    initContainers: {{- . | nindent 6 }}
    {{- end }}
    containers:
      - name: trainer
        env: {{- include "muonps.trainer.env" $m | nindent 10 }}
        volumeMounts: {{- include "muonps.trainer.volumeMounts" $m | nindent 10 }}
      {{- include "muonps.worker.container" $m | nindent 6 }}
    volumes: {{- include "muonps.worker.volumes" $m | nindent 6 }}
*/}}

{{/* This chart's own context rebuilt from the including chart's: from
"muonps" ($.Subcharts.muonps, when muonps is a dependency) or from "root". */}}
{{- define "muonps.sidecar.ctx" -}}
{{- $src := .muonps | default .root -}}
{{- toYaml (dict "Values" $src.Values "Release" .root.Release "Chart" (dict "Name" $src.Chart.Name "Version" $src.Chart.Version "AppVersion" $src.Chart.AppVersion)) -}}
{{- end -}}

{{- define "muonps.sidecar.job" -}}
{{- $ctx := fromYaml (include "muonps.sidecar.ctx" .) -}}
{{- $job := default $ctx.Values.workers.job .job -}}
{{- if not $job -}}{{- fail "muonps sidecar: no job: pass \"job\" to the include or set workers.job" -}}{{- end -}}
{{- $job -}}
{{- end -}}

{{- define "muonps.worker.podLabels" -}}
{{- $ctx := fromYaml (include "muonps.sidecar.ctx" .) -}}
{{ include "muonps.memberLabel" $ctx }}
muonps.io/job: {{ include "muonps.sidecar.job" . | quote }}
{{- end -}}

{{- define "muonps.worker.podSpec" -}}
{{- $ctx := fromYaml (include "muonps.sidecar.ctx" .) -}}
{{- $s := $ctx.Values.workers.sidecar -}}
shareProcessNamespace: {{ $s.shareProcessNamespace }}
terminationGracePeriodSeconds: {{ add (int $ctx.Values.workers.drainTimeoutSeconds) 15 }}
{{- if $s.hostIPC }}
hostIPC: true
{{- end }}
{{- end -}}

{{/* The GPU index the autotune initContainer measures: the sidecar's
cuda:N. Fails for a cpu or auto device when autotune is on. */}}
{{- define "muonps.sidecar.autotuneDevice" -}}
{{- $device := .Values.workers.sidecar.device -}}
{{- if not (regexMatch "^cuda:[0-9]+$" $device) -}}
{{- fail (printf "workers.costTable.autotune.shapes: autotune measures the sidecar worker's GPU, and workers.sidecar.device is %q; set cuda:N, or give a table measured elsewhere in workers.costTable.configMap (for CPU workers: muonps-autotune --backend cpu)" $device) -}}
{{- end -}}
{{- trimPrefix "cuda:" $device -}}
{{- end -}}

{{/* The autotune initContainer of a sidecar pod (a list of one), or nothing
when workers.costTable.autotune.shapes is empty. It gets the worker's GPU
claim (workers.sidecar.gpuClaimName) and resources; the trainer and the
worker start after it, so it has the GPU to itself. */}}
{{- define "muonps.worker.initContainers" -}}
{{- $ctx := fromYaml (include "muonps.sidecar.ctx" .) -}}
{{- if eq (include "muonps.costTable.source" $ctx) "autotune" -}}
{{- $s := $ctx.Values.workers.sidecar -}}
{{- $res := deepCopy $s.resources -}}
{{- with $s.gpuClaimName -}}
{{- $_ := set $res "claims" (list (dict "name" .)) -}}
{{- end -}}
{{- include "muonps.costTable.autotuneContainer" (dict "ctx" $ctx "prefix" "muonps-" "device" (include "muonps.sidecar.autotuneDevice" $ctx) "resources" $res "runAsUser" $s.runAsUser) -}}
{{- end -}}
{{- end -}}

{{- define "muonps.worker.volumes" -}}
{{- $ctx := fromYaml (include "muonps.sidecar.ctx" .) -}}
- name: muonps-shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ $ctx.Values.workers.sidecar.shmSizeLimit }}
- name: muonps-socket
  emptyDir: {}
- name: muonps-tmp
  emptyDir: {}
- name: muonps-metrics-token
  secret:
    secretName: {{ include "muonps.metricsTokenSecret" $ctx }}
{{ include "muonps.client.volumes" (dict "ctx" $ctx "prefix" "muonps-") }}
{{- with include "muonps.costTable.volumes" (dict "ctx" $ctx "prefix" "muonps-") }}
{{ . }}
{{- end }}
{{- end -}}

{{- define "muonps.trainer.volumeMounts" -}}
{{- $ctx := fromYaml (include "muonps.sidecar.ctx" .) -}}
- name: muonps-shm
  mountPath: /dev/shm
- name: muonps-socket
  mountPath: {{ $ctx.Values.workers.sidecar.socketDir }}
{{ include "muonps.client.volumeMounts" (dict "ctx" $ctx "prefix" "muonps-") }}
{{- end -}}

{{- define "muonps.trainer.env" -}}
{{- $ctx := fromYaml (include "muonps.sidecar.ctx" .) -}}
- name: MUONPS_COORDINATOR
  value: {{ include "muonps.coordinatorAddress" $ctx | quote }}
- name: MUONPS_JOB
  value: {{ include "muonps.sidecar.job" . | quote }}
- name: MUONPS_WORKER_SOCKET
  value: {{ printf "%s/worker.sock" $ctx.Values.workers.sidecar.socketDir | quote }}
{{ include "muonps.client.env" $ctx }}
{{- end -}}

{{- define "muonps.worker.container" -}}
{{- $ctx := fromYaml (include "muonps.sidecar.ctx" .) -}}
{{- $v := $ctx.Values -}}
{{- $s := $v.workers.sidecar -}}
{{- if eq (include "muonps.costTable.source" $ctx) "autotune" -}}
{{- $_ := include "muonps.sidecar.autotuneDevice" $ctx -}}
{{- end -}}
- name: muonps-worker
  image: {{ include "muonps.image" (dict "ctx" $ctx "role" "worker") }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    - --coordinator={{ include "muonps.coordinatorAddress" $ctx }}
    - --job={{ include "muonps.sidecar.job" . }}
    - --socket={{ $s.socketDir }}/worker.sock
    - --device={{ $s.device }}
    - --gpu_transport={{ $s.gpuTransport }}
    - --precision={{ $v.workers.precision }}
    - --memory_bytes={{ int64 $s.memoryBytes }}
    - --host=$(POD_IP)
    - --node=$(NODE_NAME)
    {{- if gt (float64 $v.workers.network.gbsPerWorker) 0.0 }}
    - --network_gbs={{ $v.workers.network.gbsPerWorker }}
    {{- end }}
    - --data_port={{ $v.workers.dataPort }}
    - --metrics_address=$(POD_IP):{{ $v.workers.metricsPort }}
    - --metrics_token_file=/var/run/muonps-metrics/token
    - --io_timeout_ms={{ int64 $v.workers.ioTimeoutMs }}
    - --drain_timeout={{ int $v.workers.drainTimeoutSeconds }}s
    - --log_level={{ $v.workers.logLevel }}
    {{- with include "muonps.costTable.file" $ctx }}
    - --cost_table={{ . }}
    {{- end }}
    {{- include "muonps.client.args" $ctx | nindent 4 }}
    {{- range $v.workers.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    {{- include "muonps.worker.env" $ctx | nindent 4 }}
  ports:
    - name: muonps-data
      containerPort: {{ $v.workers.dataPort }}
    - name: muonps-metrics
      containerPort: {{ $v.workers.metricsPort }}
  readinessProbe:
    tcpSocket:
      port: muonps-metrics
    periodSeconds: 5
  resources:
    {{- if hasPrefix "cuda" $s.device }}
    {{- include "muonps.worker.gpuResources" (dict "ctx" $ctx "resources" $s.resources) | nindent 4 }}
    {{- else }}
    {{- toYaml $s.resources | nindent 4 }}
    {{- end }}
    {{- with $s.gpuClaimName }}
    claims:
      - name: {{ . }}
    {{- end }}
  securityContext:
    {{- if hasPrefix "cuda" $s.device }}
    {{- include "muonps.worker.securityContext" $ctx | replace "65532" (toString (int64 $s.runAsUser)) | nindent 4 }}
    {{- else }}
    {{- include "muonps.securityContext" $ctx | replace "65532" (toString (int64 $s.runAsUser)) | nindent 4 }}
    {{- end }}
  volumeMounts:
    - name: muonps-shm
      mountPath: /dev/shm
    - name: muonps-socket
      mountPath: {{ $s.socketDir }}
    - name: muonps-tmp
      mountPath: /tmp
    - name: muonps-metrics-token
      mountPath: /var/run/muonps-metrics
      readOnly: true
    {{- include "muonps.client.volumeMounts" (dict "ctx" $ctx "prefix" "muonps-") | nindent 4 }}
    {{- with include "muonps.costTable.volumeMounts" (dict "ctx" $ctx "prefix" "muonps-") }}
    {{- . | nindent 4 }}
    {{- end }}
{{- end -}}
