{{- define "wattpipe.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "wattpipe.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "wattpipe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "wattpipe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "wattpipe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "wattpipe.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
The extender's own name label: its pods must not match the agent DaemonSet's selector (a DaemonSet claims
the pods its selector matches), the agent Service's or the ServiceMonitor's.
*/}}
{{- define "wattpipe.extenderSelectorLabels" -}}
app.kubernetes.io/name: {{ include "wattpipe.name" . }}-extender
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "wattpipe.extenderLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "wattpipe.extenderSelectorLabels" . }}
app.kubernetes.io/component: extender
app.kubernetes.io/part-of: {{ include "wattpipe.name" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "wattpipe.extenderServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- printf "%s-extender" (include "wattpipe.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- include "wattpipe.serviceAccountName" . }}
{{- end }}
{{- end }}

{{- define "wattpipe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "wattpipe.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The pipeline configuration: files/config.yaml with the receivers and processors the values switch on or
off. tests/deploy mirrors these steps to validate each combination without helm.
*/}}
{{- define "wattpipe.config" -}}
{{- if .Values.configOverride }}
{{- .Values.configOverride }}
{{- else }}
{{- $cfg := .Files.Get "files/config.yaml" | fromYaml }}
{{- $metrics := $cfg.service.pipelines.metrics }}
{{- range $name, $on := dict "procfs" .Values.procfs.enabled "podresources" .Values.podResources.enabled }}
{{- if not $on }}
{{- $_ := unset $cfg.receivers $name }}
{{- $_ := set $metrics "receivers" (without $metrics.receivers $name) }}
{{- end }}
{{- end }}
{{- if or (not .Values.cpu.enabled) (not .Values.hostSys.enabled) (not .Values.procfs.enabled) }}
{{- $_ := unset $cfg.receivers "rapl" }}
{{- $_ := set $metrics "receivers" (without $metrics.receivers "rapl") }}
{{- $_ := unset $cfg.processors "cpu_attribution" }}
{{- $_ := set $metrics "processors" (without $metrics.processors "cpu_attribution") }}
{{- if .Values.procfs.enabled }}
{{- $_ := set $cfg.receivers.procfs "cpu_time" false }}
{{- end }}
{{- end }}
{{- if and (hasKey $cfg.processors "cpu_attribution") .Values.cpu.config }}
{{- $_ := set $cfg.processors "cpu_attribution" .Values.cpu.config }}
{{- end }}
{{- if .Values.dcgm.enabled }}
{{- $_ := set $cfg.receivers "dcgm" .Values.dcgm.config }}
{{- $_ := set $metrics "receivers" (append $metrics.receivers "dcgm") }}
{{- end }}
{{- if .Values.dra.enabled }}
{{- $_ := set $cfg.receivers "dra" .Values.dra.config }}
{{- $_ := set $metrics "receivers" (append $metrics.receivers "dra") }}
{{- end }}
{{- if .Values.k8s.enabled }}
{{- $_ := set $cfg.processors "k8s" .Values.k8s.config }}
{{- $processors := list }}
{{- range $metrics.processors }}
{{- if eq . "energy" }}{{ $processors = append $processors "k8s" }}{{ end }}
{{- $processors = append $processors . }}
{{- end }}
{{- $_ := set $metrics "processors" $processors }}
{{- end }}
{{- if .Values.topology.enabled }}
{{- $_ := set $cfg.receivers "gpu_topology" (dict) }}
{{- $_ := set $metrics "receivers" (append $metrics.receivers "gpu_topology") }}
{{- $_ := set $cfg.processors "gpu_placement" (dict) }}
{{- $_ := set $metrics "processors" (append $metrics.processors "gpu_placement") }}
{{- if .Values.topology.annotateNode }}
{{- $_ := set $cfg.exporters "node_annotation" (dict) }}
{{- $_ := set $metrics "exporters" (append $metrics.exporters "node_annotation") }}
{{- end }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}
{{- end }}

{{/*
The cluster-wide pipeline (templates/cluster.yaml): files/cluster.yaml with the k8s_cluster receiver's
options from the cluster.config value.
*/}}
{{- define "wattpipe.clusterConfig" -}}
{{- $cfg := .Files.Get "files/cluster.yaml" | fromYaml }}
{{- $_ := set $cfg.receivers "k8s_cluster" .Values.cluster.config }}
{{- toYaml $cfg }}
{{- end }}
