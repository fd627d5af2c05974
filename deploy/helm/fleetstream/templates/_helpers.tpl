{{/* Name of a component: <release>-<component>. */}}
{{- define "fleetstream.name" -}}
{{- printf "%s-%s" .root.Release.Name .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of a component. */}}
{{- define "fleetstream.selector" -}}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{/* Labels of every object of a component. */}}
{{- define "fleetstream.labels" -}}
{{ include "fleetstream.selector" . }}
app.kubernetes.io/part-of: fleetstream
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The NATS URLs the services connect to: every node of the in-chart cluster by its stable name. */}}
{{- define "fleetstream.natsURL" -}}
{{- if .Values.nats.enabled -}}
{{- $nats := include "fleetstream.name" (dict "root" . "component" "nats") -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.nats.replicas) -}}
{{- $urls = append $urls (printf "nats://%s-%d.%s-headless.%s.svc:4222" $nats $i $nats $.Release.Namespace) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{- required "nats.externalURL is required when nats.enabled is false" .Values.nats.externalURL -}}
{{- end -}}
{{- end -}}

{{/* Pod-level security of every hub pod: the images run as 65532 and need nothing else. */}}
{{- define "fleetstream.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "fleetstream.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}
