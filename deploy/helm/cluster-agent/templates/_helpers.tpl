{{- define "cluster-agent.name" -}}
{{- printf "%s-cluster-agent" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cluster-agent.selector" -}}
app.kubernetes.io/name: cluster-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cluster-agent.labels" -}}
{{ include "cluster-agent.selector" . }}
app.kubernetes.io/part-of: fleetstream
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
