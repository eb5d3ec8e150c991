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

{{/* The coordinator's server TLS Secret (tls.crt, tls.key, ca.crt). */}}
{{- define "muonps.tlsSecret" -}}
{{- .Values.tls.secretName | default (printf "%s-coordinator-tls" (include "muonps.fullname" .)) -}}
{{- end -}}

{{/* The clients' TLS Secret (tls.crt, tls.key) under mutual TLS. */}}
{{- define "muonps.clientTlsSecret" -}}
{{- .Values.tls.clientSecretName | default (printf "%s-client-tls" (include "muonps.fullname" .)) -}}
{{- end -}}

{{/* DNS names of the coordinator's server certificate (generated or
cert-manager): its Service's names, localhost (port-forward, the probe),
and tls.extraDnsNames. */}}
{{- define "muonps.serverDnsNames" -}}
{{- $svc := printf "%s-coordinator" (include "muonps.fullname" .) -}}
{{- $ns := .Release.Namespace -}}
{{- toYaml (concat (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) "localhost") .Values.tls.extraDnsNames) -}}
{{- end -}}

{{/* The Secret holding the bearer token, and its key. */}}
{{- define "muonps.tokenSecret" -}}
{{- .Values.auth.secretName | default (printf "%s-token" (include "muonps.fullname" .)) -}}
{{- end -}}
{{- define "muonps.tokenKey" -}}
{{- if .Values.auth.secretName -}}{{- .Values.auth.secretKey -}}{{- else -}}token{{- end -}}
{{- end -}}

{{/* Where every client (workers, trainers, helm test, the probe) finds its
credentials: the CA, the token, and its certificate under mutual TLS. */}}
{{- define "muonps.client.caFile" -}}/etc/muonps/ca/ca.crt{{- end -}}
{{- define "muonps.client.tokenFile" -}}/etc/muonps/token/token{{- end -}}
{{- define "muonps.client.certFile" -}}/etc/muonps/client-tls/tls.crt{{- end -}}
{{- define "muonps.client.keyFile" -}}/etc/muonps/client-tls/tls.key{{- end -}}

{{/* Client credential flags (muonps-worker, muonps CLI). */}}
{{- define "muonps.client.args" -}}
- --token_file={{ include "muonps.client.tokenFile" . }}
- --tls_ca_file={{ include "muonps.client.caFile" . }}
{{- if .Values.tls.mutual }}
- --tls_cert_file={{ include "muonps.client.certFile" . }}
- --tls_key_file={{ include "muonps.client.keyFile" . }}
{{- end }}
{{- end -}}

{{/* Client credential environment (the trainer's client library). */}}
{{- define "muonps.client.env" -}}
- name: MUONPS_TOKEN_FILE
  value: {{ include "muonps.client.tokenFile" . }}
- name: MUONPS_TLS_CA_FILE
  value: {{ include "muonps.client.caFile" . }}
{{- if .Values.tls.mutual }}
- name: MUONPS_TLS_CERT_FILE
  value: {{ include "muonps.client.certFile" . }}
- name: MUONPS_TLS_KEY_FILE
  value: {{ include "muonps.client.keyFile" . }}
{{- end }}
{{- end -}}

{{/* Client credential volumes: the server Secret's ca.crt only (never its
key), the token, and the client certificate under mutual TLS. Volume names
take the prefix given as "prefix" (pods that also hold other volumes). */}}
{{- define "muonps.client.volumes" -}}
- name: {{ .prefix }}ca
  secret:
    secretName: {{ include "muonps.tlsSecret" .ctx }}
    items:
      - key: ca.crt
        path: ca.crt
- name: {{ .prefix }}token
  secret:
    secretName: {{ include "muonps.tokenSecret" .ctx }}
    items:
      - key: {{ include "muonps.tokenKey" .ctx }}
        path: token
{{- if .ctx.Values.tls.mutual }}
- name: {{ .prefix }}client-tls
  secret:
    secretName: {{ include "muonps.clientTlsSecret" .ctx }}
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- end }}
{{- end -}}

{{- define "muonps.client.volumeMounts" -}}
- name: {{ .prefix }}ca
  mountPath: /etc/muonps/ca
  readOnly: true
- name: {{ .prefix }}token
  mountPath: /etc/muonps/token
  readOnly: true
{{- if .ctx.Values.tls.mutual }}
- name: {{ .prefix }}client-tls
  mountPath: /etc/muonps/client-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* The coordinator's exec health check: the CLI over TLS to 127.0.0.1
(health needs no token; under mutual TLS it presents the client
certificate). */}}
{{- define "muonps.coordinator.healthCommand" -}}
- /usr/local/bin/muonps
- health
- --coordinator=127.0.0.1:{{ .Values.coordinator.port }}
- --tls_ca_file={{ include "muonps.client.caFile" . }}
{{- if .Values.tls.mutual }}
- --tls_cert_file={{ include "muonps.client.certFile" . }}
- --tls_key_file={{ include "muonps.client.keyFile" . }}
{{- end }}
- --timeout_ms={{ mul (int .Values.coordinator.probes.timeoutSeconds) 800 }}
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
{{- if not .Values.tls.enabled -}}
{{- fail "tls.enabled=false: the muonps coordinator refuses to start on a non-loopback address (a pod listens on its pod IP) without TLS and a bearer token, so a plaintext install could never run. Keep tls.enabled true: with tls.secretName and tls.certManager unset the chart generates the certificates itself." -}}
{{- end -}}
{{- if not .Values.auth.enabled -}}
{{- fail "auth.enabled=false: the muonps coordinator refuses to start on a non-loopback address (a pod listens on its pod IP) without TLS and a bearer token, so an install without a token could never run. Keep auth.enabled true: with auth.secretName unset the chart generates a random token itself." -}}
{{- end -}}
{{- if and .Values.tls.secretName .Values.tls.certManager.enabled -}}
{{- fail "tls.secretName and tls.certManager.enabled are both set: give an existing Secret or let cert-manager issue one, not both" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.certManager.issuerRef.name) -}}
{{- fail "tls.certManager.issuerRef.name: cert-manager needs the Issuer (or ClusterIssuer, with kind) that signs the certificates" -}}
{{- end -}}
{{- if and .Values.tls.mutual .Values.tls.secretName (not .Values.tls.clientSecretName) -}}
{{- fail "tls.clientSecretName: with tls.mutual and an existing tls.secretName the chart cannot sign client certificates; give a kubernetes.io/tls Secret with the clients' tls.crt and tls.key (signed by the CA in the server Secret's ca.crt)" -}}
{{- end -}}
{{- if and .Values.tls.clientSecretName (not .Values.tls.secretName) -}}
{{- fail "tls.clientSecretName is used only with an existing tls.secretName: generated and cert-manager server certificates come with a client certificate from the same CA" -}}
{{- end -}}
{{- if not .Values.coordinator.enabled -}}
{{- if not .Values.tls.secretName -}}
{{- fail "tls.secretName: with coordinator.enabled false the workers need the CA of the coordinator of another release; name its server Secret (RELEASE-muonps-coordinator-tls; only ca.crt is mounted)" -}}
{{- end -}}
{{- if not .Values.auth.secretName -}}
{{- fail "auth.secretName: with coordinator.enabled false the workers need the token of the coordinator of another release; name its Secret (RELEASE-muonps-token)" -}}
{{- end -}}
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
{{- $pool := .Values.workers.pool -}}
{{- if and $pool.enabled (eq $pool.device "cuda") (eq $pool.gpuTransport "ipc") (empty $pool.colocateWith) -}}
{{- fail "workers.pool.colocateWith: a GPU pool with gpuTransport ipc talks to the job's other workers by CUDA IPC, so it must run on the trainers' node; give the trainer pods' labels, e.g. {app: my-trainer}, or use gpuTransport nccl" -}}
{{- end -}}
{{- $net := .Values.workers.network -}}
{{- if and $net.hostNetwork $pool.enabled (ne $pool.antiAffinity "hard") -}}
{{- fail "workers.network.hostNetwork: pool pods on the host network bind the node's ports (workers.metricsPort), so two on one node collide; set workers.pool.antiAffinity to hard (one pool pod per node), or give the pods RDMA devices in their own network (workers.network.rdmaResources)" -}}
{{- end -}}
{{- if and $net.hostNetwork $pool.enabled (eq $pool.gpuTransport "ipc") -}}
{{- fail "workers.network.hostNetwork is for NCCL between nodes; a pool with gpuTransport ipc shares its trainers' node and needs no host network" -}}
{{- end -}}
{{- if and $net.hostNetwork $pool.enabled .Values.networkPolicy.enabled (empty .Values.networkPolicy.nodeCidrs) -}}
{{- fail "networkPolicy.nodeCidrs: with workers.network.hostNetwork the pool's traffic comes from its nodes' addresses, which the NetworkPolicies' pod selectors do not match, so the pool could reach neither the coordinator nor its peers; list the nodes' CIDRs, e.g. [10.0.0.0/16], or set networkPolicy.enabled false" -}}
{{- end -}}
{{- include "muonps.costTable.validate" . -}}
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
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: NCCL_NVLS_ENABLE
  value: {{ ternary "1" "0" .Values.workers.nccl.nvlsEnable | quote }}
{{- with .Values.workers.nccl.socketIfname }}
- name: NCCL_SOCKET_IFNAME
  value: {{ . | quote }}
{{- end }}
{{- with .Values.workers.nccl.ibHca }}
- name: NCCL_IB_HCA
  value: {{ . | quote }}
{{- end }}
{{- with .Values.workers.nccl.ibGidIndex }}
- name: NCCL_IB_GID_INDEX
  value: {{ . | quote }}
{{- end }}
{{- if .Values.workers.nccl.ibDisable }}
- name: NCCL_IB_DISABLE
  value: "1"
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

{{/* A GPU worker container's: the common one, with IPC_LOCK when
workers.network.ipcLock (RDMA pins the memory it registers). */}}
{{- define "muonps.worker.securityContext" -}}
{{- $sc := include "muonps.securityContext" . | fromYaml -}}
{{- if .Values.workers.network.ipcLock -}}
{{- $_ := set $sc.capabilities "add" (list "IPC_LOCK") -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/* A GPU worker container's resources: `resources` with
workers.network.rdmaResources added to its requests and limits. */}}
{{- define "muonps.worker.gpuResources" -}}
{{- $res := deepCopy .resources -}}
{{- with .ctx.Values.workers.network.rdmaResources -}}
{{- $_ := set $res "requests" (merge (deepCopy .) ($res.requests | default dict)) -}}
{{- $_ := set $res "limits" (merge (deepCopy .) ($res.limits | default dict)) -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}
