{{/* Labels of every object. */}}
{{- define "gpupack.labels" -}}
app.kubernetes.io/name: gpupack
app.kubernetes.io/part-of: gpupack
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: the same as the kustomize base. */}}
{{- define "gpupack.selector" -}}
app.kubernetes.io/name: gpupack
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{- define "gpupack.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{/* CEL: the pod names an nvidia.com/ resource or carries a gpupack.io/ annotation. */}}
{{- define "gpupack.gpuPodCEL" -}}
object.spec.containers.exists(c, has(c.resources)
  && ((has(c.resources.limits) && c.resources.limits.exists(k, k.startsWith('nvidia.com/')))
    || (has(c.resources.requests) && c.resources.requests.exists(k, k.startsWith('nvidia.com/')))))
|| (has(object.metadata.annotations)
  && object.metadata.annotations.exists(k, k.startsWith('gpupack.io/')))
{{- end -}}
