{{/*
Names. The chart's name (nameOverride) is the app.kubernetes.io/name label and part of
every selector; the full name (fullnameOverride, else derived from the release) prefixes
every object, cluster-scoped ones included, so several releases can share a cluster.
The default release name "gpupack" gives the names of the kustomize base.
*/}}
{{- define "gpupack.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpupack.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "gpupack.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object: Helm's bookkeeping plus commonLabels. */}}
{{- define "gpupack.labels" -}}
app.kubernetes.io/name: {{ include "gpupack.name" . }}
app.kubernetes.io/part-of: gpupack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of one component's objects: call with (dict "root" $ "component" "webhook"). */}}
{{- define "gpupack.componentLabels" -}}
{{ include "gpupack.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Selector labels of one component: the same as the kustomize base. */}}
{{- define "gpupack.selector" -}}
app.kubernetes.io/name: {{ include "gpupack.name" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Labels of one component's pods: the selector, part-of and commonLabels. */}}
{{- define "gpupack.podLabels" -}}
{{ include "gpupack.selector" . }}
app.kubernetes.io/part-of: gpupack
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The gpupack image; the tag defaults to the chart's appVersion. */}}
{{- define "gpupack.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end -}}

{{/*
kube-scheduler's tag: kubeScheduler.tag, else the cluster's own version (kube-scheduler
may not be newer than kube-apiserver, and should match it). Distribution suffixes such as
"-eks-a737599" or "+k3s1" are dropped: registry.k8s.io tags are plain vX.Y.Z.
*/}}
{{- define "gpupack.kubeSchedulerTag" -}}
{{- if .Values.kubeScheduler.tag -}}
{{- .Values.kubeScheduler.tag -}}
{{- else -}}
{{- $v := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version -}}
{{- if not $v -}}
{{- fail (printf "cannot derive kube-scheduler's tag from the cluster version %q; set kubeScheduler.tag" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- printf "v%s" (trimPrefix "v" $v) -}}
{{- end -}}
{{- end -}}

{{- define "gpupack.tlsSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "gpupack.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{/* Pod-level scheduling and pull secrets of the Deployments (values of the top level). */}}
{{- define "gpupack.podScheduling" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
{{- if .root.Values.affinity }}
  {{- toYaml .root.Values.affinity | nindent 2 }}
{{- else }}
  # Replicas on different nodes when possible (the default when affinity is empty).
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "gpupack.selector" . | nindent 14 }}
{{- end }}
{{- end -}}

{{/* CEL: the pod names an nvidia.com/ resource or carries a gpupack.io/ annotation. */}}
{{- define "gpupack.gpuPodCEL" -}}
object.spec.containers.exists(c, has(c.resources)
  && ((has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('nvidia.com/')))
    || (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('nvidia.com/')))))
|| (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources)
  && ((has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('nvidia.com/')))
    || (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('nvidia.com/'))))))
|| (has(object.metadata.annotations)
  && object.metadata.annotations.exists(k, k.startsWith('gpupack.io/')))
{{- end -}}

{{/*
The extender's --bind-timeout: two thirds of extender.httpTimeout (at most 30 s), so
that a Binding's outcome is known before kube-scheduler gives up on the bind verb.
*/}}
{{- define "gpupack.bindTimeout" -}}
{{- $timeout := .Values.extender.httpTimeout -}}
{{- $seconds := 0.0 -}}
{{- if hasSuffix "ms" $timeout -}}
{{- $seconds = divf (trimSuffix "ms" $timeout | float64) 1000 -}}
{{- else if hasSuffix "s" $timeout -}}
{{- $seconds = trimSuffix "s" $timeout | float64 -}}
{{- else -}}
{{- $seconds = mulf (trimSuffix "m" $timeout | float64) 60 -}}
{{- end -}}
{{- $bind := round (divf (mulf $seconds 2) 3) 3 -}}
{{- if gt $bind 30.0 }}30{{ else }}{{ $bind }}{{ end -}}
{{- end -}}

{{/*
The node agent's namespace (nodeAgent.namespace, else <release namespace>-node-agent): the
agent needs hostPID, hostPath and root, which Pod Security's restricted level (that of
the release namespace) forbids; it runs in a namespace of its own at the privileged level.
*/}}
{{- define "gpupack.agentNamespace" -}}
{{- default (printf "%s-node-agent" .Release.Namespace) .Values.nodeAgent.namespace -}}
{{- end -}}
