{{/* Labels every object carries. */}}
{{- define "metalmend.labels" -}}
app.kubernetes.io/part-of: metalmend
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "metalmend.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The pod and container hardening both Deployments share: the image runs as a non-root
user on a read-only root filesystem, without privileges. */}}
{{- define "metalmend.podSecurity" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- define "metalmend.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* One number of the settings tree (`settings`, section, key), or metalmend's default
when the values do not set it: (list .Values.settings "power" "soft_timeout" 180.0). The
defaults are those of metalmend.settings (tests/integration/test_chart_alerts.py checks
they agree). */}}
{{- define "metalmend.setting" -}}
{{- $settings := index . 0 | default dict -}}
{{- $section := get $settings (index . 1) | default dict -}}
{{- if hasKey $section (index . 2) -}}
{{- get $section (index . 2) | float64 -}}
{{- else -}}
{{- index . 3 | float64 -}}
{{- end -}}
{{- end }}

{{/* Labels of the monitoring objects: ours and monitoring.labels. */}}
{{- define "metalmend.monitoringLabels" -}}
{{ include "metalmend.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}
