{{/* The labels every object carries: the selector's, as deploy/ferry.yaml has them. */}}
{{- define "ferry.labels" -}}
app.kubernetes.io/name: ferry
{{- end }}

{{/* The image every container runs: repository:tag, the tag by default the chart's appVersion. */}}
{{- define "ferry.image" -}}
image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* A container's env: NODE_NAME (the config's nodeName resolves to it), then extraEnv. */}}
{{- define "ferry.env" -}}
env:
  - name: NODE_NAME
    valueFrom:
      fieldRef: {fieldPath: spec.nodeName}
{{- with .Values.extraEnv }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}
