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

{{/* Open vSwitch's Pods' labels (their own DaemonSet, templates/openvswitch.yaml). */}}
{{- define "ferry.ovsLabels" -}}
app.kubernetes.io/name: ferry-openvswitch
{{- end }}

{{/* Both daemons answer on their control sockets, by the pid in each pidfile. */}}
{{- define "ferry.ovsAnswers" -}}
for d in ovsdb-server ovs-vswitchd; do ovs-appctl -T 5 -t /var/run/openvswitch/$d.$(cat /var/run/openvswitch/$d.pid).ctl version >/dev/null || exit 1; done
{{- end }}

{{/* route-sync's wait for them. */}}
{{- define "ferry.ovsWait" -}}
until (for d in ovsdb-server ovs-vswitchd; do ovs-appctl -T 5 -t /var/run/openvswitch/$d.$(cat /var/run/openvswitch/$d.pid 2>/dev/null).ctl version >/dev/null 2>&1 || exit 1; done); do sleep 1; done
{{- end }}
