{{/* Names and labels shared by every template. */}}

{{- define "runpod-kubelet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "runpod-kubelet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "runpod-kubelet.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "runpod-kubelet.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "runpod-kubelet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "runpod-kubelet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* selectorLabels: call with (list . "component") */}}
{{- define "runpod-kubelet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "runpod-kubelet.name" (index . 0) }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "runpod-kubelet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "runpod-kubelet.webhookName" -}}
{{- printf "%s-webhook" (include "runpod-kubelet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "runpod-kubelet.controllerName" -}}
{{- printf "%s-controller" (include "runpod-kubelet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "runpod-kubelet.certsName" -}}
{{- printf "%s-certs" (include "runpod-kubelet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "runpod-kubelet.tlsSecret" -}}
{{- default (printf "%s-webhook-tls" (include "runpod-kubelet.fullname" .)) .Values.certs.secretName -}}
{{- end -}}

{{- define "runpod-kubelet.apiKeySecret" -}}
{{- default (printf "%s-runpod" (include "runpod-kubelet.fullname" .)) .Values.runpod.existingSecret -}}
{{- end -}}

{{- define "runpod-kubelet.apiKeyKey" -}}
{{- if .Values.runpod.existingSecret -}}{{ .Values.runpod.existingSecretKey }}{{- else -}}RUNPOD_API_KEY{{- end -}}
{{- end -}}

{{/* Environment every component shares: logs, its namespace, the API key. */}}
{{- define "runpod-kubelet.commonEnv" -}}
- name: RUNPOD_KUBELET_LOG_FORMAT
  value: {{ .Values.log.format | quote }}
- name: RUNPOD_KUBELET_LOG_LEVEL
  value: {{ .Values.log.level | quote }}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{- define "runpod-kubelet.apiKeyEnv" -}}
- name: RUNPOD_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "runpod-kubelet.apiKeySecret" . }}
      key: {{ include "runpod-kubelet.apiKeyKey" . }}
{{- end -}}

{{/* Flags of the certs command, shared by the hook Job and the CronJob. */}}
{{- define "runpod-kubelet.certsArgs" -}}
- certs
- --mode
- {{ .Values.certs.mode | quote }}
- --namespace
- {{ .Release.Namespace | quote }}
- --secret-name
- {{ include "runpod-kubelet.tlsSecret" . | quote }}
- --service-name
- {{ include "runpod-kubelet.webhookName" . | quote }}
- --webhook-configuration
- {{ .Values.webhook.configurationName | quote }}
- --validity
- {{ .Values.certs.validity | quote }}
- --renew-before
- {{ .Values.certs.renewBefore | quote }}
- --ca-validity
- {{ .Values.certs.caValidity | quote }}
- --ca-renew-before
- {{ .Values.certs.caRenewBefore | quote }}
{{- end -}}

{{/* Flags the controller and its drain share: which node, cluster and cloud account. Call with
(dict "root" . "node" NODE), NODE as built in _controller.tpl. */}}
{{- define "runpod-kubelet.controllerArgs" -}}
- controller
{{ include "runpod-kubelet.nodeArgs" . }}
{{- end -}}

{{- define "runpod-kubelet.drainArgs" -}}
- controller
- drain
{{ include "runpod-kubelet.nodeArgs" . }}
- --timeout
- {{ .root.Values.controller.drain.timeout | quote }}
{{- end -}}

{{- /* The default node passes no --provider (runpod), as before nodes existed. */ -}}
{{- define "runpod-kubelet.nodeArgs" -}}
{{- $v := .root.Values -}}
{{- with .node.provider -}}
- --provider
- {{ . }}
{{ end -}}
- --nodename
- {{ .node.nodeName | quote }}
{{- if eq .node.provider "vastai" }}
- --vastai-api-url
- {{ $v.vastai.apiUrl | quote }}
{{- else }}
- --runpod-api-url
- {{ $v.runpod.apiUrl | quote }}
{{- end }}
{{- with $v.controller.clusterId }}
- --cluster-id
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The Vast.ai installation policy, the same for the webhook and every controller. Only what
differs from the binary's defaults is passed, so installs without Vast.ai render as before. */}}
{{- define "runpod-kubelet.vastaiPolicyArgs" -}}
{{- with .Values.vastai -}}
{{- if and .regions .countries -}}
{{- fail "set vastai.regions or vastai.countries, not both" -}}
{{- end -}}
{{- with .regions }}
- --vastai-regions
- {{ join "," . | quote }}
{{- end }}
{{- with .countries }}
- --vastai-countries
- {{ join "," . | quote }}
{{- end }}
{{- if .datacenterOnly }}
- --vastai-datacenter-only=true
{{- end }}
{{- if not .verifiedOnly }}
- --vastai-verified-only=false
{{- end }}
{{- if ne (float64 .minReliability) 0.98 }}
- --vastai-min-reliability
- {{ .minReliability | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{- define "runpod-kubelet.vastaiKeySecret" -}}
{{- default (printf "%s-vastai" (include "runpod-kubelet.fullname" .)) .Values.vastai.existingSecret -}}
{{- end -}}

{{- define "runpod-kubelet.vastaiKeyKey" -}}
{{- if .Values.vastai.existingSecret -}}{{ .Values.vastai.existingSecretKey }}{{- else -}}VAST_API_KEY{{- end -}}
{{- end -}}

{{/* The key of a `nodes` entry: call with (list . ENTRY). Its own Secret, else the chart's Secret
of its provider. */}}
{{- define "runpod-kubelet.nodeKeyEnv" -}}
{{- $ := index . 0 -}}
{{- $node := index . 1 -}}
{{- $vast := eq $node.provider "vastai" -}}
{{- $var := ternary "VAST_API_KEY" "RUNPOD_API_KEY" $vast -}}
{{- $secret := include "runpod-kubelet.apiKeySecret" $ -}}
{{- $key := include "runpod-kubelet.apiKeyKey" $ -}}
{{- if $node.existingSecret -}}
{{- $secret = $node.existingSecret -}}
{{- $key = default $var $node.existingSecretKey -}}
{{- else if $vast -}}
{{- $secret = include "runpod-kubelet.vastaiKeySecret" $ -}}
{{- $key = include "runpod-kubelet.vastaiKeyKey" $ -}}
{{- end -}}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
{{- end -}}

{{/* Whether the chart's Vast.ai Secret is needed: a vastai node without its own Secret. */}}
{{- define "runpod-kubelet.needsVastaiSecret" -}}
{{- if not .Values.vastai.existingSecret -}}
{{- range .Values.nodes -}}
{{- if and (eq .provider "vastai") (not .existingSecret) }}true{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Base name of a `nodes` entry's objects (room left for -metrics and -drain): call with
(list . NODENAME). */}}
{{- define "runpod-kubelet.nodeControllerName" -}}
{{- printf "%s-%s" (include "runpod-kubelet.controllerName" (index . 0)) (index . 1) | trunc 55 | trimSuffix "-" -}}
{{- end -}}

{{/* Hook annotations of the certs Job and its account: call with (list . WEIGHT). Pre-install it
makes the Secrets (the webhook configuration does not exist yet); post-install, once the webhook
is ready and the configuration exists, it patches the caBundle, before `helm install --wait`
returns; pre/post-upgrade it renews what is due. */}}
{{- define "runpod-kubelet.certsHookAnnotations" -}}
helm.sh/hook: pre-install,pre-upgrade,post-install,post-upgrade
helm.sh/hook-weight: {{ index . 1 | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

{{/* Pod spec of a one-shot container: call with (list . SERVICEACCOUNT ARGS-YAML EXTRA-ENV-YAML). */}}
{{- define "runpod-kubelet.jobPod" -}}
{{- $ := index . 0 -}}
serviceAccountName: {{ index . 1 }}
restartPolicy: Never
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $.Values.podSecurityContext | nindent 2 }}
containers:
  - name: {{ index . 4 }}
    image: {{ include "runpod-kubelet.image" $ }}
    imagePullPolicy: {{ $.Values.image.pullPolicy }}
    args:
      {{- index . 2 | nindent 6 }}
    env:
      {{- include "runpod-kubelet.commonEnv" $ | nindent 6 }}
      {{- with index . 3 }}
      {{- . | nindent 6 }}
      {{- end }}
    resources:
      {{- toYaml $.Values.certs.resources | nindent 6 }}
    securityContext:
      {{- toYaml $.Values.securityContext | nindent 6 }}
{{- end -}}

{{- define "runpod-kubelet.certsHookArgs" -}}
{{ include "runpod-kubelet.certsArgs" . }}
{{- with .Values.certs.rotate }}
- --rotate
- {{ . | quote }}
{{- end }}
{{- end -}}
