{{/* A virtual node's controller: its metrics Service, Deployment and drain Job, for the default
node (controller.yaml, drain-job.yaml) and each `nodes` entry (nodes.yaml). Call with a NODE
dict: root (the chart's context), name (of the objects), account (the ServiceAccount), nodeName,
provider ("" for the default node: no --provider), component and extra (a `nodes` entry: its pods
also carry runpod.io/node, so no two nodes' Services or Deployments select each other's pods),
replicas, maxPods, maxGpus, kubeletPort, metricsPort, extraArgs, keyEnv (the key's env YAML). */}}

{{/* Fills the NODE dict: call with (list . ENTRY OUT), ENTRY a `nodes` entry or nil (the default
node); OUT an empty dict (a template returns only text). */}}
{{- define "runpod-kubelet.fillNode" -}}
{{- $ := index . 0 -}}
{{- $entry := index . 1 -}}
{{- $out := index . 2 -}}
{{- $c := $.Values.controller -}}
{{- $account := include "runpod-kubelet.nodeAccount" (list $ $entry) -}}
{{- $_ := set $out "root" $ -}}
{{- $_ = set $out "account" $account -}}
{{- if $entry -}}
{{- $_ = set $out "name" (include "runpod-kubelet.nodeControllerName" (list $ $entry.name)) -}}
{{- $_ = set $out "nodeName" $entry.name -}}
{{- $_ = set $out "provider" $entry.provider -}}
{{- $_ = set $out "component" "node-controller" -}}
{{- $_ = set $out "extra" true -}}
{{- $_ = set $out "replicas" (default $c.replicas $entry.replicas) -}}
{{- $_ = set $out "maxPods" (default $c.maxPods $entry.maxPods) -}}
{{- $_ = set $out "maxGpus" (default $c.maxGpus $entry.maxGpus) -}}
{{- $_ = set $out "kubeletPort" (default $c.kubeletPort $entry.kubeletPort) -}}
{{- $_ = set $out "metricsPort" (default $c.metricsPort $entry.metricsPort) -}}
{{- $_ = set $out "extraArgs" (default list $entry.extraArgs) -}}
{{- $_ = set $out "keyEnv" (include "runpod-kubelet.nodeKeyEnv" (list $ $entry)) -}}
{{- $_ = set $out "keySource" (include "runpod-kubelet.nodeKeySource" (list $ $entry)) -}}
{{- $_ = set $out "key" (include "runpod-kubelet.nodeKey" (list $ $entry) | fromYaml) -}}
{{- $price := (include "runpod-kubelet.maxGpuPrice" $) -}}
{{- if hasKey $entry "maxGpuPrice" -}}
{{- if gt (float64 $entry.maxGpuPrice) (float64 $price) -}}
{{- fail (printf "nodes: %q has maxGpuPrice %v above runpod.maxGpuPrice %v, the cap the webhook enforces for every pod; raise runpod.maxGpuPrice" $entry.name $entry.maxGpuPrice $price) -}}
{{- end -}}
{{- $price = $entry.maxGpuPrice -}}
{{- end -}}
{{- $_ = set $out "maxGpuPrice" $price -}}
{{- $_ = set $out "datacenterIds" (ternary $entry.datacenterIds $.Values.runpod.datacenterIds (hasKey $entry "datacenterIds")) -}}
{{- /* A node narrows the installation's policy, never widens it: the webhook enforces that one. */ -}}
{{- with $.Values.runpod.datacenterIds -}}
{{- $global := . -}}
{{- range ($entry.datacenterIds | default list) -}}
{{- if not (has . $global) -}}
{{- fail (printf "nodes: %q lists datacenter %s, which runpod.datacenterIds (the installation's, enforced by the webhook) does not allow" $entry.name .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $field := list "regions" "countries" -}}
{{- $global := index $.Values.vastai $field | default list -}}
{{- if $global -}}
{{- range (index ($entry.vastai | default dict) $field | default list) -}}
{{- if not (has . $global) -}}
{{- fail (printf "nodes: %q lists vastai.%s %s, which vastai.%s (the installation's, enforced by the webhook) does not allow" $entry.name $field . $field) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $policy := deepCopy $.Values.vastai -}}
{{- range $key, $value := ($entry.vastai | default dict) -}}
{{- $_ = set $policy $key $value -}}
{{- end -}}
{{- $_ = set $out "vastai" $policy -}}
{{- $_ = set $out "namespaces" ($entry.namespaces | default list) -}}
{{- else -}}
{{- /* The release's name for it, whatever ServiceAccount it runs as. */ -}}
{{- $_ = set $out "name" (include "runpod-kubelet.controllerName" $) -}}
{{- $_ = set $out "nodeName" $.Values.nodeName -}}
{{- $_ = set $out "provider" "" -}}
{{- $_ = set $out "component" "controller" -}}
{{- $_ = set $out "extra" false -}}
{{- $_ = set $out "replicas" (default $c.replicas $.Values.replicaCount) -}}
{{- $_ = set $out "maxPods" $c.maxPods -}}
{{- $_ = set $out "maxGpus" $c.maxGpus -}}
{{- $_ = set $out "kubeletPort" $c.kubeletPort -}}
{{- $_ = set $out "metricsPort" $c.metricsPort -}}
{{- $_ = set $out "extraArgs" $c.extraArgs -}}
{{- $_ = set $out "keyEnv" (include "runpod-kubelet.nodeKeyEnv" (list $ nil)) -}}
{{- $_ = set $out "keySource" (include "runpod-kubelet.nodeKeySource" (list $ nil)) -}}
{{- $_ = set $out "key" (include "runpod-kubelet.nodeKey" (list $ nil) | fromYaml) -}}
{{- $_ = set $out "maxGpuPrice" (include "runpod-kubelet.maxGpuPrice" $) -}}
{{- $_ = set $out "datacenterIds" $.Values.runpod.datacenterIds -}}
{{- $_ = set $out "vastai" $.Values.vastai -}}
{{- $_ = set $out "namespaces" ($.Values.nodeNamespaces | default list) -}}
{{- end -}}
{{- end -}}

{{- define "runpod-kubelet.controllerComponentLabels" -}}
app.kubernetes.io/component: {{ .component }}
{{- if .extra }}
runpod.io/node: {{ .nodeName | quote }}
{{- end }}
{{- end -}}

{{- define "runpod-kubelet.controllerSelectorLabels" -}}
{{ include "runpod-kubelet.selectorLabels" (list .root .component) }}
{{- if .extra }}
runpod.io/node: {{ .nodeName | quote }}
{{- end }}
{{- end -}}

{{- define "runpod-kubelet.controllerService" -}}
{{- $root := .root -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ .name }}-metrics
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "runpod-kubelet.labels" $root | nindent 4 }}
    {{- include "runpod-kubelet.controllerComponentLabels" . | nindent 4 }}
  {{- with $root.Values.controller.service.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  selector:
    {{- include "runpod-kubelet.controllerSelectorLabels" . | nindent 4 }}
  ports:
    - name: metrics
      port: {{ .metricsPort }}
      targetPort: metrics
      protocol: TCP
    {{- if not (include "runpod-kubelet.plainMetrics" $root) }}
    # /metrics over TLS, for callers allowed `get nodes/metrics`.
    - name: kubelet
      port: {{ .kubeletPort }}
      targetPort: kubelet
      protocol: TCP
    {{- end }}
{{- end -}}

{{- define "runpod-kubelet.controllerDeployment" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- /* The Go kubelet chart's top-level pod settings apply to the controller (its only pod). */ -}}
{{- $c := deepCopy $v.controller -}}
{{- range $key := list "nodeSelector" "tolerations" "affinity" "resources" "podAnnotations" -}}
{{- with index $v $key -}}{{- $_ := set $c $key . -}}{{- end -}}
{{- end -}}
{{- if and $v.controller.hostNetwork (eq (int .kubeletPort) 10250) }}
{{- fail (printf "controller.hostNetwork: node %q uses kubeletPort 10250, the host kubelet's own port; set controller.kubeletPort (or the node's kubeletPort) to another, e.g. 10260" .nodeName) }}
{{- end }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "runpod-kubelet.labels" $root | nindent 4 }}
    {{- include "runpod-kubelet.controllerComponentLabels" . | nindent 4 }}
  {{- if and $v.controller.drain.enabled $v.controller.drain.finalizer }}
  # However this Deployment is deleted (helm, Argo CD or Flux pruning, kubectl), it stays until
  # its controller has drained the node: nothing is left billing.
  finalizers: [runpod.io/drain]
  {{- end }}
spec:
  replicas: {{ .replicas }}
  selector:
    matchLabels:
      {{- include "runpod-kubelet.controllerSelectorLabels" . | nindent 6 }}
  {{- if $v.controller.updateStrategy }}
  strategy:
    {{- toYaml $v.controller.updateStrategy | nindent 4 }}
  {{- else if not $v.controller.leaderElection.enabled }}
  # Without leader election two controllers must never run at once: the old one goes first.
  strategy:
    type: Recreate
  {{- end }}
  template:
    metadata:
      labels:
        {{- include "runpod-kubelet.controllerSelectorLabels" . | nindent 8 }}
        {{- with include "runpod-kubelet.podLabels" $root | trim }}{{ . | nindent 8 }}{{ end }}
      {{- with $c.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ .account }}
      {{- with include "runpod-kubelet.podCommon" (list $root $c) | trim }}{{ . | nindent 6 }}{{ end }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $v.podSecurityContext | nindent 8 }}
      containers:
        - name: controller
          image: {{ include "runpod-kubelet.image" $root }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args:
            {{- include "runpod-kubelet.controllerArgs" (dict "root" $root "node" .) | nindent 12 }}
            - --kubelet-port
            - {{ .kubeletPort | quote }}
            {{- if and $v.controller.drain.enabled $v.controller.drain.finalizer }}
            - --owner-deployment
            - {{ printf "%s/%s" $root.Release.Namespace .name | quote }}
            - --drain-timeout
            - {{ $v.controller.drain.timeout | quote }}
            {{- end }}
            {{- with include "runpod-kubelet.kubeletTlsArgs" (list $root .nodeName) | trim }}
            {{- . | nindent 12 }}
            {{- end }}
            - --metrics-listen
            - {{ printf "0.0.0.0:%v" .metricsPort | quote }}
            - --metrics-plain={{ include "runpod-kubelet.plainMetrics" $root | eq "true" }}
            - --reconcile-interval
            - {{ include "runpod-kubelet.reconcileInterval" $root | quote }}
            - --provision-timeout
            - {{ $v.controller.provisionTimeout | quote }}
            - --create-settle
            - {{ $v.controller.createSettle | quote }}
            - --outage-grace
            - {{ $v.controller.outageGrace | quote }}
            - --max-pending-time
            - {{ $v.controller.maxPendingTime | quote }}
            - --pending-job-threshold
            - {{ $v.controller.pendingJobThreshold | quote }}
            - --idle-gpu-threshold
            - {{ $v.controller.idleGpuThreshold | quote }}
            - --idle-gpu-after
            - {{ $v.controller.idleGpuAfter | quote }}
            - --max-pods
            - {{ .maxPods | quote }}
            - --expose-ports
            - {{ $v.controller.exposePorts | quote }}
            {{- if $v.controller.acceptSeedTolerations }}
            - --accept-seed-tolerations
            {{- end }}
            - --exec-ssh={{ $v.controller.execSsh }}
            - --cluster-network={{ and $v.controller.execSsh $v.controller.network.enabled }}
            - --cluster-services-allowed={{ join "," $v.controller.network.clusterServicesAllowed }}
            - --cluster-domain={{ $v.controller.network.clusterDomain }}
            - --max-gpus
            - {{ .maxGpus | quote }}
            {{- with $v.controller.concurrency }}
            - --concurrency
            - {{ . | quote }}
            {{- end }}
            - --max-gpu-price
            - {{ .maxGpuPrice | quote }}
            {{- with .datacenterIds }}
            - --datacenter-ids
            - {{ join "," . | quote }}
            {{- end }}
            - --allowed-cloud-types
            - {{ join "," $v.runpod.allowedCloudTypes | quote }}
            {{- with $v.webhook.excludeNamespaces }}
            - --exclude-namespaces
            - {{ join "," . | quote }}
            {{- end }}
            {{- with include "runpod-kubelet.vastaiPolicyArgs" .vastai | trim }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with .namespaces }}
            - --serve-namespaces
            - {{ join "," . | quote }}
            {{- end }}
            {{- with include "runpod-kubelet.namespaceNodes" $root }}
            - --namespace-nodes
            - {{ . | quote }}
            {{- end }}
            {{- with $v.defaultBudgetPerHour | toString }}
            - --default-budget-per-hour
            - {{ . | quote }}
            {{- end }}
            - --leader-elect={{ $v.controller.leaderElection.enabled }}
            {{- if $v.controller.leaderElection.enabled }}
            - --leader-elect-lease-duration
            - {{ $v.controller.leaderElection.leaseDuration | quote }}
            - --leader-elect-renew-deadline
            - {{ $v.controller.leaderElection.renewDeadline | quote }}
            - --leader-elect-retry-period
            - {{ $v.controller.leaderElection.retryPeriod | quote }}
            {{- end }}
            {{- range .extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            {{- include "runpod-kubelet.commonEnv" $root | nindent 12 }}
            {{- .keyEnv | nindent 12 }}
            # The node's InternalIP follows the pod that leads.
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            # The controller's heap rises and falls with its pods: mimalloc gives freed pages
            # back at once instead of a second later, and commits its arenas as they are used
            # (benches/README.md, the 1,000-pod figures). A name set in extraEnv is left to it
            # (one entry per name: server-side apply refuses duplicates).
            {{- $userEnv := list }}
            {{- range $root.Values.extraEnv }}{{ $userEnv = append $userEnv .name }}{{ end }}
            {{- if not (has "MIMALLOC_PURGE_DELAY" $userEnv) }}
            - name: MIMALLOC_PURGE_DELAY
              value: "0"
            {{- end }}
            {{- if not (has "MIMALLOC_ARENA_EAGER_COMMIT" $userEnv) }}
            - name: MIMALLOC_ARENA_EAGER_COMMIT
              value: "0"
            {{- end }}
            {{- with include "runpod-kubelet.cloudEnv" $root | trim }}{{ . | nindent 12 }}{{ end }}
            {{- with include "runpod-kubelet.extraEnv" $root | trim }}{{ . | nindent 12 }}{{ end }}
          {{- with include "runpod-kubelet.extraEnvFrom" $root | trim }}{{ . | nindent 10 }}{{ end }}
          ports:
            - name: kubelet
              containerPort: {{ .kubeletPort }}
              protocol: TCP
            - name: metrics
              containerPort: {{ .metricsPort }}
              protocol: TCP
          readinessProbe:
            httpGet: {path: /readyz, port: metrics}
            {{- toYaml $v.controller.readinessProbe | nindent 12 }}
          livenessProbe:
            httpGet: {path: /healthz, port: metrics}
            {{- toYaml $v.controller.livenessProbe | nindent 12 }}
          resources:
            {{- toYaml $c.resources | nindent 12 }}
          securityContext:
            {{- toYaml $v.securityContext | nindent 12 }}
          {{- $mounts := concat (include "runpod-kubelet.controllerMounts" $root | fromYamlArray) $v.extraVolumeMounts }}
          {{- with $mounts }}
          volumeMounts:
            {{- toYaml . | nindent 12 }}
          {{- end }}
      {{- $volumes := concat (include "runpod-kubelet.controllerVolumes" $root | fromYamlArray) $v.extraVolumes }}
      {{- with $volumes }}
      volumes:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $c.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $c.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.controller.topologySpreadConstraints }}
      topologySpreadConstraints:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- if $c.affinity }}
        {{- toYaml $c.affinity | nindent 8 }}
        {{- else }}
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "runpod-kubelet.controllerSelectorLabels" . | nindent 20 }}
        {{- end }}
{{- end -}}

{{/* The pre-delete drain of a node: every cloud pod of this cluster and node is terminated, the
job waits until none bills, and the virtual node is deleted. */}}
{{- define "runpod-kubelet.drainJob" -}}
{{- $root := .root -}}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .name }}-drain
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "runpod-kubelet.labels" $root | nindent 4 }}
    {{- include "runpod-kubelet.controllerComponentLabels" (merge (dict "component" "drain") .) | nindent 4 }}
  annotations:
    helm.sh/hook: pre-delete
    helm.sh/hook-weight: "0"
    helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
spec:
  backoffLimit: 2
  template:
    metadata:
      labels:
        {{- include "runpod-kubelet.controllerSelectorLabels" (merge (dict "component" "drain") .) | nindent 8 }}
        {{- with include "runpod-kubelet.podLabels" $root | trim }}{{ . | nindent 8 }}{{ end }}
    spec:
      {{- $args := include "runpod-kubelet.drainArgs" (dict "root" $root "node" .) }}
      {{- $env := printf "%s\n%s" .keyEnv (include "runpod-kubelet.cloudEnv" $root) | trim }}
      {{- $volumes := include "runpod-kubelet.cloudVolumes" $root | fromYamlArray }}
      {{- $mounts := include "runpod-kubelet.cloudMounts" $root | fromYamlArray }}
      {{- include "runpod-kubelet.jobPod" (list $root .account $args $env "drain" $volumes $mounts) | nindent 6 }}
{{- end -}}
