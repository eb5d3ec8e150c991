{{/* The cost table: measured Newton-Schulz seconds per shape, algorithm and
batch size (scheduler/cost_table.h) that a worker hands the coordinator's
planner with --cost_table. Either an existing ConfigMap, mounted read-only,
or muonps-autotune run in an initContainer on the worker's GPU, writing into
an emptyDir the worker mounts read-only. "muonps.costTable.source" says which:
"configMap", "autotune" or nothing. */}}
{{- define "muonps.costTable.source" -}}
{{- $c := .Values.workers.costTable -}}
{{- if and $c.configMap $c.autotune.shapes -}}
{{- fail "workers.costTable.configMap and workers.costTable.autotune.shapes are both set: give workers a table measured elsewhere (configMap) or let them measure their GPU before they start (autotune.shapes), not both" -}}
{{- end -}}
{{- if $c.configMap -}}configMap{{- else if $c.autotune.shapes -}}autotune{{- end -}}
{{- end -}}

{{- define "muonps.costTable.autotuneDir" -}}/var/lib/muonps-costs{{- end -}}
{{- define "muonps.costTable.configMapDir" -}}/etc/muonps/cost-table{{- end -}}

{{/* The file a worker passes as --cost_table; empty without a table. */}}
{{- define "muonps.costTable.file" -}}
{{- $source := include "muonps.costTable.source" . -}}
{{- if eq $source "configMap" -}}
{{- include "muonps.costTable.configMapDir" . }}/cost_table.jsonl
{{- else if eq $source "autotune" -}}
{{- include "muonps.costTable.autotuneDir" . }}/cost_table.jsonl
{{- end -}}
{{- end -}}

{{/* Cost-table values the schema cannot check: shapes that are one table
entry up to orientation (muonps-autotune refuses them, which would leave the
pod in Init:CrashLoopBackOff), repeated batch sizes, a CPU pool told to
autotune, and a second --cost_table in workers.extraArgs. */}}
{{- define "muonps.costTable.validate" -}}
{{- $source := include "muonps.costTable.source" . -}}
{{- $a := .Values.workers.costTable.autotune -}}
{{- $seen := dict -}}
{{- range $shape := splitList "," $a.shapes | compact -}}
{{- $dims := splitList "x" $shape -}}
{{- $rows := int64 (index $dims 0) -}}
{{- $cols := int64 (index $dims 1) -}}
{{- $key := printf "%dx%d" (min $rows $cols) (max $rows $cols) -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "workers.costTable.autotune.shapes: %s and %s are one shape up to orientation (Newton-Schulz runs on the wide side, so the cost table has one entry for both, and muonps-autotune refuses the pair); list only one of them" (get $seen $key) $shape) -}}
{{- end -}}
{{- $_ := set $seen $key $shape -}}
{{- end -}}
{{- $batches := dict -}}
{{- range $batch := splitList "," $a.batches | compact -}}
{{- if hasKey $batches $batch -}}
{{- fail (printf "workers.costTable.autotune.batches: %s appears twice in %q" $batch $a.batches) -}}
{{- end -}}
{{- $_ := set $batches $batch true -}}
{{- end -}}
{{- $pool := .Values.workers.pool -}}
{{- if and (eq $source "autotune") $pool.enabled (ne $pool.device "cuda") -}}
{{- fail "workers.costTable.autotune.shapes: autotune measures the pool's GPU, and workers.pool.device is cpu; for CPU workers measure a table with `muonps-autotune --backend cpu` on the pool's node type and give it in workers.costTable.configMap" -}}
{{- end -}}
{{- if $source -}}
{{- range .Values.workers.extraArgs -}}
{{- if hasPrefix "--cost_table" . -}}
{{- fail (printf "workers.extraArgs has %q and workers.costTable is set: the chart passes --cost_table itself; remove one of them" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Cost-table volumes of a worker pod: (dict "ctx" CONTEXT "prefix"
VOLUME_NAME_PREFIX); empty without a table. */}}
{{- define "muonps.costTable.volumes" -}}
{{- $c := .ctx.Values.workers.costTable -}}
{{- $source := include "muonps.costTable.source" .ctx -}}
{{- if eq $source "configMap" -}}
- name: {{ .prefix }}cost-table
  configMap:
    name: {{ $c.configMap }}
    items:
      - key: {{ $c.key }}
        path: cost_table.jsonl
{{- else if eq $source "autotune" -}}
- name: {{ .prefix }}costs
  emptyDir:
    sizeLimit: 16Mi
{{- end -}}
{{- end -}}

{{/* The worker container's cost-table mount (read-only), as above. */}}
{{- define "muonps.costTable.volumeMounts" -}}
{{- $source := include "muonps.costTable.source" .ctx -}}
{{- if eq $source "configMap" -}}
- name: {{ .prefix }}cost-table
  mountPath: {{ include "muonps.costTable.configMapDir" .ctx }}
  readOnly: true
{{- else if eq $source "autotune" -}}
- name: {{ .prefix }}costs
  mountPath: {{ include "muonps.costTable.autotuneDir" .ctx }}
  readOnly: true
{{- end -}}
{{- end -}}

{{/* The initContainer that measures the worker's GPU and writes its cost
table before the worker starts: the worker's image, GPU (resources, and
claims in them), precision and security context; of the worker's
environment only workers.nccl.extraEnv's non-NCCL variables (autotune runs
no NCCL). Takes (dict "ctx" CONTEXT "prefix" VOLUME_NAME_PREFIX "device" GPU
index "resources" the worker's resources "runAsUser" UID). */}}
{{- define "muonps.costTable.autotuneContainer" -}}
{{- $v := .ctx.Values -}}
{{- $a := $v.workers.costTable.autotune -}}
- name: muonps-autotune
  image: {{ include "muonps.image" (dict "ctx" .ctx "role" "worker") }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  command:
    - /usr/local/bin/muonps-autotune
  args:
    - --backend=cuda
    - --device={{ .device }}
    - --precision={{ $v.workers.precision }}
    - --shapes={{ $a.shapes }}
    - --batches={{ $a.batches }}
    - --repeats={{ int64 $a.repeats }}
    - --sustain_seconds={{ $a.sustainSeconds }}
    - --out={{ include "muonps.costTable.autotuneDir" .ctx }}/cost_table.jsonl
  {{- $env := list -}}
  {{- range $k, $val := $v.workers.nccl.extraEnv -}}
  {{- if not (hasPrefix "NCCL_" $k) -}}
  {{- $env = append $env (dict "name" $k "value" (toString $val)) -}}
  {{- end -}}
  {{- end -}}
  {{- with $env }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  resources:
    {{- toYaml .resources | nindent 4 }}
  securityContext:
    {{- include "muonps.securityContext" .ctx | replace "65532" (toString (int64 .runAsUser)) | nindent 4 }}
  volumeMounts:
    - name: {{ .prefix }}costs
      mountPath: {{ include "muonps.costTable.autotuneDir" .ctx }}
{{- end -}}
