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
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The ServiceAccount a component runs as: call with (list . DEFAULT-NAME). The chart's own
(DEFAULT-NAME) unless serviceAccount.create is false: then serviceAccount.name, an account you
made, for every component (the chart still binds each component's RBAC to it). */}}
{{- define "runpod-kubelet.account" -}}
{{- $ := index . 0 -}}
{{- if $.Values.serviceAccount.create -}}
{{- index . 1 -}}
{{- else -}}
{{- required "serviceAccount.create is false: set serviceAccount.name to the ServiceAccount every component runs as" $.Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A ServiceAccount the chart makes: call with (list . NAME HOOK-ANNOTATIONS-YAML). Nothing
when serviceAccount.create is false. */}}
{{- define "runpod-kubelet.serviceAccount" -}}
{{- $ := index . 0 -}}
{{- if $.Values.serviceAccount.create -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ index . 1 }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "runpod-kubelet.labels" $ | nindent 4 }}
  {{- $annotations := index . 2 }}
  {{- if or $annotations $.Values.serviceAccount.annotations }}
  annotations:
    {{- with $.Values.serviceAccount.annotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with $annotations }}
    {{- . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/* Pod labels besides the selector's: commonLabels (on every object, pods included), then
podLabels (which win on a clash). Call with . */}}
{{- define "runpod-kubelet.podLabels" -}}
{{- $labels := merge (deepCopy (.Values.podLabels | default dict)) (.Values.commonLabels | default dict) -}}
{{- with $labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod spec fields every workload shares: call with (list . COMPONENT-VALUES). The priority
class, and for a component with hostNetwork (the apiserver cannot reach pod IPs, e.g. EKS with a
custom CNI) the host network with a DNS policy that still resolves cluster names. */}}
{{- define "runpod-kubelet.podCommon" -}}
{{- $ := index . 0 -}}
{{- $c := index . 1 -}}
{{- with $.Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- if $c.hostNetwork }}
hostNetwork: true
dnsPolicy: {{ default "ClusterFirstWithHostNet" $c.dnsPolicy }}
{{- else if $c.dnsPolicy }}
dnsPolicy: {{ $c.dnsPolicy }}
{{- end }}
{{- end -}}

{{/* Scheduling of a pod: call with COMPONENT-VALUES (nodeSelector, tolerations, affinity;
topologySpreadConstraints when given). */}}
{{- define "runpod-kubelet.scheduling" -}}
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
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The user's extra env (extraEnv) of every container. */}}
{{- define "runpod-kubelet.extraEnv" -}}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* envFrom and volumeMounts of every container; call with . */}}
{{- define "runpod-kubelet.extraEnvFrom" -}}
{{- with .Values.extraEnvFrom }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end }}
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
- --create-settle
- {{ .root.Values.controller.createSettle | quote }}
{{- if .root.Values.controller.drain.finalizer }}
- --owner-deployment
- {{ printf "%s/%s" .root.Release.Namespace .node.name | quote }}
{{- end }}
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
- --api-key-secret
- {{ .node.keySource | quote }}
{{- if eq .node.provider "vastai" }}
- --vastai-api-url
- {{ $v.vastai.apiUrl | quote }}
{{- else }}
- --runpod-api-url
- {{ $v.runpod.apiUrl | quote }}
{{- end }}
{{- with include "runpod-kubelet.clusterId" .root }}
- --cluster-id
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The Vast.ai policy flags: call with the policy (vastai, or a `nodes` entry's merged over
it). Only what differs from the binary's defaults is passed, so installs without Vast.ai render
as before. */}}
{{- define "runpod-kubelet.vastaiPolicyArgs" -}}
{{- with . -}}
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

{{/* Where a node's key comes from: call with (list . ENTRY), ENTRY a `nodes` entry or nil (the
default node). YAML of var (the env variable), secret, key, and managed (the chart's own Secret,
which does not exist yet when the pre-install hooks run). */}}
{{- define "runpod-kubelet.nodeKey" -}}
{{- $ := index . 0 -}}
{{- $node := index . 1 | default dict -}}
{{- $vast := eq ($node.provider | default "runpod") "vastai" -}}
{{- $var := ternary "VAST_API_KEY" "RUNPOD_API_KEY" $vast -}}
{{- $secret := include "runpod-kubelet.apiKeySecret" $ -}}
{{- $key := include "runpod-kubelet.apiKeyKey" $ -}}
{{- $managed := not $.Values.runpod.existingSecret -}}
{{- if and $node.name (not $vast) (not $node.existingSecret) (not $.Values.runpod.enabled) -}}
{{- fail (printf "nodes: %q is a RunPod node but runpod.enabled is false: give it existingSecret, or enable runpod" $node.name) -}}
{{- end -}}
{{- if $node.existingSecret -}}
{{- $secret = $node.existingSecret -}}
{{- $key = default $var $node.existingSecretKey -}}
{{- $managed = false -}}
{{- else if $vast -}}
{{- $secret = include "runpod-kubelet.vastaiKeySecret" $ -}}
{{- $key = include "runpod-kubelet.vastaiKeyKey" $ -}}
{{- $managed = not $.Values.vastai.existingSecret -}}
{{- end -}}
var: {{ $var }}
secret: {{ $secret }}
key: {{ $key }}
managed: {{ $managed }}
{{- end -}}

{{/* The key env of a node: call with (list . ENTRY). */}}
{{- define "runpod-kubelet.nodeKeyEnv" -}}
{{- $k := include "runpod-kubelet.nodeKey" . | fromYaml -}}
- name: {{ $k.var }}
  valueFrom:
    secretKeyRef:
      name: {{ $k.secret }}
      key: {{ $k.key }}
{{- end -}}

{{/* The key's Secret as messages name it: call with (list . ENTRY). */}}
{{- define "runpod-kubelet.nodeKeySource" -}}
{{- $k := include "runpod-kubelet.nodeKey" . | fromYaml -}}
{{- printf "%s/%s (key %s)" (index . 0).Release.Namespace $k.secret $k.key -}}
{{- end -}}

{{/* The hook Secret holding the chart-managed keys for check-key (pre-install: the release's
own Secrets do not exist yet). */}}
{{- define "runpod-kubelet.checkKeySecret" -}}
{{- printf "%s-check-key" (include "runpod-kubelet.fullname" .) | trunc 63 | trimSuffix "-" -}}
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

{{/* Pod spec of a one-shot container (the hook Jobs and the CronJob, scheduled by jobs.*): call
with (list . SERVICEACCOUNT ARGS-YAML EXTRA-ENV-YAML CONTAINER-NAME VOLUMES MOUNTS), the last two
lists the Job's own (the chart's extraVolumes/extraVolumeMounts are added). */}}
{{- define "runpod-kubelet.jobPod" -}}
{{- $ := index . 0 -}}
serviceAccountName: {{ index . 1 }}
restartPolicy: Never
{{- include "runpod-kubelet.podCommon" (list $ dict) }}
{{- include "runpod-kubelet.scheduling" $.Values.jobs }}
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
      {{- with include "runpod-kubelet.extraEnv" $ | trim }}{{ . | nindent 6 }}{{ end }}
    {{- with include "runpod-kubelet.extraEnvFrom" $ | trim }}{{ . | nindent 4 }}{{ end }}
    resources:
      {{- toYaml (default $.Values.jobs.resources $.Values.certs.resources) | nindent 6 }}
    securityContext:
      {{- toYaml $.Values.securityContext | nindent 6 }}
    {{- $mounts := concat (index . 6) $.Values.extraVolumeMounts }}
    {{- with $mounts }}
    volumeMounts:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- $volumes := concat (index . 5) $.Values.extraVolumes }}
{{- with $volumes }}
volumes:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "runpod-kubelet.certsHookArgs" -}}
{{ include "runpod-kubelet.certsArgs" . }}
{{- with .Values.certs.rotate }}
- --rotate
- {{ . | quote }}
{{- end }}
{{- end -}}


{{/* The clouds this installation runs a node for (the webhook's --clouds). */}}
{{- define "runpod-kubelet.clouds" -}}
{{- $clouds := list -}}
{{- if .Values.runpod.enabled }}{{ $clouds = append $clouds "runpod" }}{{ end -}}
{{- range .Values.nodes -}}
{{- if not (has .provider $clouds) }}{{ $clouds = append $clouds .provider }}{{ end -}}
{{- end -}}
{{- join "," $clouds -}}
{{- end -}}

{{/* What the cloud clients need to reach the clouds: the egress proxy (cloud.proxy) and the
extra CA roots (cloud.caBundle), on every controller and drain. The Kubernetes client never
goes through that proxy. */}}
{{- define "runpod-kubelet.cloudEnv" -}}
{{- with .Values.cloud.proxy }}
{{- with .httpsProxy }}
- name: HTTPS_PROXY
  value: {{ . | quote }}
{{- end }}
{{- with .httpProxy }}
- name: HTTP_PROXY
  value: {{ . | quote }}
{{- end }}
{{- with .noProxy }}
- name: NO_PROXY
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- if include "runpod-kubelet.cloudVolumes" . }}
- name: RUNPOD_KUBELET_CLOUD_CA_FILE
  value: /etc/runpod-kubelet/cloud-ca/{{ .Values.cloud.caBundle.key }}
{{- end }}
{{- end -}}

{{- define "runpod-kubelet.cloudVolumes" -}}
{{- with .Values.cloud.caBundle }}
{{- if and .existingSecret .existingConfigMap }}
{{- fail "cloud.caBundle: set existingSecret or existingConfigMap, not both" }}
{{- end }}
{{- if .existingSecret }}
- name: cloud-ca
  secret:
    secretName: {{ .existingSecret }}
{{- else if .existingConfigMap }}
- name: cloud-ca
  configMap:
    name: {{ .existingConfigMap }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "runpod-kubelet.cloudMounts" -}}
{{- if include "runpod-kubelet.cloudVolumes" . }}
- name: cloud-ca
  mountPath: /etc/runpod-kubelet/cloud-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* The controller's own volumes and mounts (the cloud CA; the kubelet certificate). */}}
{{- define "runpod-kubelet.controllerVolumes" -}}
{{ include "runpod-kubelet.cloudVolumes" . }}
{{- with include "runpod-kubelet.kubeletTlsSecret" . }}
- name: kubelet-tls
  secret:
    secretName: {{ . }}
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
{{- end -}}

{{- define "runpod-kubelet.controllerMounts" -}}
{{ include "runpod-kubelet.cloudMounts" . }}
{{- if include "runpod-kubelet.kubeletTlsSecret" . }}
- name: kubelet-tls
  mountPath: /etc/runpod-kubelet/kubelet-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* The Secret holding the kubelet API's certificate (tls.crt, tls.key), if any: yours
(controller.kubeletTls.existingSecret) or cert-manager's (certManager.issuerRef). */}}
{{- define "runpod-kubelet.kubeletTlsSecret" -}}
{{- with .Values.controller.kubeletTls -}}
{{- if and (eq .mode "csr") (or .existingSecret .certManager.issuerRef) -}}
{{- fail "controller.kubeletTls: mode csr requests the certificate from the cluster; leave existingSecret and certManager.issuerRef empty" -}}
{{- end -}}
{{- if and .existingSecret .certManager.issuerRef -}}
{{- fail "controller.kubeletTls: set existingSecret or certManager.issuerRef, not both" -}}
{{- end -}}
{{- if .existingSecret -}}
{{- .existingSecret -}}
{{- else if .certManager.issuerRef -}}
{{- printf "%s-kubelet-tls" (include "runpod-kubelet.controllerName" $) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the kubelet API's certificate is requested from the cluster: mode csr, or the
default mode "" without a Secret or cert-manager issuer. */}}
{{- define "runpod-kubelet.kubeletTlsCsr" -}}
{{- with .Values.controller.kubeletTls -}}
{{- if or (eq .mode "csr") (and (eq .mode "") (not .existingSecret) (not .certManager.issuerRef)) -}}
true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The kubelet API's certificate flags, for the node named by the second argument. */}}
{{- define "runpod-kubelet.kubeletTlsArgs" -}}
{{- $root := index . 0 -}}
{{- $node := index . 1 -}}
{{- if include "runpod-kubelet.kubeletTlsSecret" $root }}
- --kubelet-tls-cert
- /etc/runpod-kubelet/kubelet-tls/tls.crt
- --kubelet-tls-key
- /etc/runpod-kubelet/kubelet-tls/tls.key
{{- else if include "runpod-kubelet.kubeletTlsCsr" $root }}
- --kubelet-tls-csr
- --kubelet-tls-secret
- {{ printf "%s/%s-kubelet-serving" $root.Release.Namespace $node | quote }}
{{- if $root.Values.controller.kubeletTls.approve }}
- --kubelet-tls-approve
{{- end }}
{{- end }}
{{- end -}}

{{/* Per node: the kept kubelet certificate Secrets, and the self-approved request names. */}}
{{- define "runpod-kubelet.kubeletServingSecrets" -}}
{{- $names := list -}}
{{- range (include "runpod-kubelet.nodeNames" . | fromJsonArray) }}{{ $names = append $names (printf "%s-kubelet-serving" .) }}{{ end -}}
{{- toJson $names -}}
{{- end -}}
{{- define "runpod-kubelet.selfApprovedRequests" -}}
{{- $names := list -}}
{{- range (include "runpod-kubelet.nodeNames" . | fromJsonArray) }}{{ $names = append $names (printf "%s-serving-runpod-kubelet" .) }}{{ end -}}
{{- toJson $names -}}
{{- end -}}

{{/* The Go kubelet chart's values, for installs moving over: kubelet.reconcileInterval and
kubelet.maxGpuPrice are read as controller.reconcileInterval and runpod.maxGpuPrice (the old name
wins when set), cluster.identifier as controller.clusterId; kubelet.namespace is refused. */}}
{{- define "runpod-kubelet.seedCheck" -}}
{{- with .Values.kubelet }}
{{- if and (hasKey . "namespace") (ne .namespace "kube-system") (ne .namespace $.Release.Namespace) }}
{{- fail (printf "kubelet.namespace (the Go kubelet chart) is not a value of this chart: every object goes into the release namespace; install with helm --namespace %s instead" .namespace) }}
{{- end }}
{{- end }}
{{- if contains "bsvogler" (.Values.image.repository | default "") }}
{{- fail (printf "image.repository %s is the Go kubelet's image, which does not run this chart; remove image from your values (the chart's default is this project's image)" .Values.image.repository) }}
{{- end }}
{{- end -}}

{{/* The Go kubelet chart's values this chart does not use, for NOTES.txt. */}}
{{- define "runpod-kubelet.ignoredSeedValues" -}}
{{- $ignored := list -}}
{{- range $key := list "health" "conduit" "livenessProbe" "readinessProbe" -}}
{{- if hasKey $.Values $key }}{{ $ignored = append $ignored $key }}{{ end -}}
{{- end -}}
{{- with .Values.kubelet -}}
{{- if hasKey . "healthServerAddress" }}{{ $ignored = append $ignored "kubelet.healthServerAddress" }}{{ end -}}
{{- if hasKey . "namespace" }}{{ $ignored = append $ignored (printf "kubelet.namespace (everything is in %s)" $.Release.Namespace) }}{{ end -}}
{{- end -}}
{{- join ", " $ignored -}}
{{- end -}}

{{- define "runpod-kubelet.maxGpuPrice" -}}
{{- $seed := (.Values.kubelet | default dict).maxGpuPrice -}}
{{- if kindIs "invalid" $seed }}{{ .Values.runpod.maxGpuPrice }}{{ else }}{{ $seed }}{{ end -}}
{{- end -}}

{{- define "runpod-kubelet.reconcileInterval" -}}
{{- $seed := (.Values.kubelet | default dict).reconcileInterval -}}
{{- if kindIs "invalid" $seed }}{{ .Values.controller.reconcileInterval }}{{ else }}{{ $seed }}{{ end -}}
{{- end -}}

{{- define "runpod-kubelet.clusterId" -}}
{{- if .Values.controller.clusterId -}}
{{- .Values.controller.clusterId -}}
{{- else if .Values.cluster -}}
{{- .Values.cluster.identifier | default "" -}}
{{- end -}}
{{- end -}}

{{/* The installation's node bindings, NAMESPACE=NODE@CLOUD comma-separated (nodeNamespaces and every
`nodes` entry's namespaces), given to the webhook and every controller; empty: none. */}}
{{- define "runpod-kubelet.namespaceNodes" -}}
{{- $pairs := list -}}
{{- $seen := dict -}}
{{- $lists := list (list $.Values.nodeName ($.Values.nodeNamespaces | default list)) -}}
{{- range $node := .Values.nodes | default list -}}
{{- $lists = append $lists (list $node.name ($node.namespaces | default list)) -}}
{{- end -}}
{{- range $lists -}}
{{- $name := index . 0 -}}
{{- range (index . 1) -}}
{{- if hasKey $seen . -}}
{{- fail (printf "namespace %s is listed by nodes %s and %s: a namespace's pods run on one node only" . (get $seen .) $name) -}}
{{- end -}}
{{- $_ := set $seen . $name -}}
{{- end -}}
{{- end -}}
{{- if .Values.runpod.enabled -}}
{{- range .Values.nodeNamespaces | default list -}}
{{- $pairs = append $pairs (printf "%s=%s@runpod" . $.Values.nodeName) -}}
{{- end -}}
{{- end -}}
{{- range $node := .Values.nodes | default list -}}
{{- range $node.namespaces | default list -}}
{{- $pairs = append $pairs (printf "%s=%s@%s" . $node.name $node.provider) -}}
{{- end -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{- /* The release's virtual node names (the default node and every `nodes` entry), as JSON: the
only Nodes and node Leases its controllers may change. */ -}}
{{- define "runpod-kubelet.nodeNames" -}}
{{- $names := list .Values.nodeName -}}
{{- range .Values.nodes }}{{- $names = append $names .name }}{{- end -}}
{{- toJson (uniq $names) -}}
{{- end -}}

{{/*
The webhook's CEL match condition, as webhook/src/registration.rs MATCH_CONDITION (one line).
*/}}
{{- define "runpod-kubelet.matchCondition" -}}
object.spec.containers.exists(c, has(c.resources) && ((has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits) || (has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests))) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && ((has(c.resources.limits) && 'nvidia.com/gpu' in c.resources.limits) || (has(c.resources.requests) && 'nvidia.com/gpu' in c.resources.requests)))) || (has(object.metadata.annotations) && object.metadata.annotations.exists(k, k.startsWith('runpod.io/') || k.startsWith('vast.ai/'))) || (has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, o.kind == 'Job'))
{{- end -}}

{{/* Every controller Deployment of the release (the default node's and each nodes entry's). */}}
{{- define "runpod-kubelet.controllerDeployments" -}}
{{- $names := list (include "runpod-kubelet.controllerName" .) -}}
{{- range .Values.nodes }}{{ $names = append $names (include "runpod-kubelet.nodeControllerName" (list $ .name)) }}{{ end -}}
{{- toJson $names -}}
{{- end -}}

{{/* The ServiceAccount a node's controller runs as: its own (named as its Deployment) when the
node serves listed namespaces (a team's node) and the chart makes accounts, so no team's node
holds another team's rights; else the shared controller account. Call with (list . ENTRY), ENTRY
a `nodes` entry or nil. */}}
{{- define "runpod-kubelet.nodeAccount" -}}
{{- $ := index . 0 -}}
{{- $entry := index . 1 -}}
{{- if and $entry $entry.namespaces $.Values.serviceAccount.create -}}
{{- include "runpod-kubelet.nodeControllerName" (list $ $entry.name) -}}
{{- else -}}
{{- include "runpod-kubelet.account" (list $ (include "runpod-kubelet.controllerName" $)) -}}
{{- end -}}
{{- end -}}

{{/* Every controller ServiceAccount, as RoleBinding subjects. */}}
{{- define "runpod-kubelet.controllerSubjects" -}}
{{- $accounts := list (include "runpod-kubelet.nodeAccount" (list . nil)) -}}
{{- range .Values.nodes }}{{ $accounts = append $accounts (include "runpod-kubelet.nodeAccount" (list $ .)) }}{{ end -}}
{{- range ($accounts | uniq) }}
- kind: ServiceAccount
  name: {{ . }}
  namespace: {{ $.Release.Namespace }}
{{- end }}
{{- end -}}

{{/* "true" when every node of the release lists the namespaces it serves: the controllers then
read pods' Secrets and ConfigMaps through a Role in each of those namespaces, and no
ClusterRole reads Secrets. */}}
{{- define "runpod-kubelet.podInputsByNamespace" -}}
{{- $all := true -}}
{{- if and .Values.runpod.enabled (not .Values.nodeNamespaces) }}{{ $all = false }}{{ end -}}
{{- range .Values.nodes }}{{ if not .namespaces }}{{ $all = false }}{{ end }}{{ end -}}
{{- if $all }}true{{ end -}}
{{- end -}}

{{/* Each node's SSH key Secret (NODE-ssh), by name. */}}
{{- define "runpod-kubelet.nodeSshSecrets" -}}
{{- $names := list -}}
{{- range (include "runpod-kubelet.nodeNames" . | fromJsonArray) }}{{ $names = append $names (printf "%s-ssh" .) }}{{ end -}}
{{- toJson $names -}}
{{- end -}}

{{/* "true" when the controllers serve /metrics on the plain-HTTP port too. */}}
{{- define "runpod-kubelet.plainMetrics" -}}
{{- $plain := .Values.controller.plainMetrics -}}
{{- if eq (toString $plain) "auto" -}}
{{- /* The TLS scrape verifies with the cluster CA, which signs csr-mode certificates only. */ -}}
{{- if or (not .Values.controller.hostNetwork) (not (include "runpod-kubelet.kubeletTlsCsr" .)) }}true{{ end -}}
{{- else if $plain -}}
true
{{- end -}}
{{- end -}}
