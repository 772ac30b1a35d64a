{{/*
Chart name, overridable.
*/}}
{{- define "trainyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Resource name prefix. Truncated so that suffixes such as "-device-plugin"
still fit the 63-character limit of Service names and labels.
*/}}
{{- define "trainyard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 39 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 39 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 39 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trainyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "trainyard.labels" -}}
helm.sh/chart: {{ include "trainyard.chart" . }}
app.kubernetes.io/name: {{ include "trainyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trainyard
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels of one component. Call with (dict "ctx" $ "component" "operator").
They never change across upgrades: selectors are immutable.
*/}}
{{- define "trainyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainyard.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Labels of one component's objects: the common labels plus the component.
*/}}
{{- define "trainyard.componentLabels" -}}
{{ include "trainyard.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "trainyard.operator.fullname" -}}
{{- printf "%s-operator" (include "trainyard.fullname" .) }}
{{- end }}

{{- define "trainyard.devicePlugin.fullname" -}}
{{- printf "%s-device-plugin" (include "trainyard.fullname" .) }}
{{- end }}

{{- define "trainyard.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "trainyard.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trainyard.devicePlugin.serviceAccountName" -}}
{{- if .Values.devicePlugin.serviceAccount.create }}
{{- default (include "trainyard.devicePlugin.fullname" .) .Values.devicePlugin.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.devicePlugin.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference: repository@digest, else repository:tag (the appVersion when
empty). No image is published, so an empty repository fails naming the value.
Call with (dict "ctx" $ "image" .Values.operator.image "key" "operator" "target" "operator").
*/}}
{{- define "trainyard.image" -}}
{{- if not .image.repository }}
{{- fail (printf "%s.image.repository is not set: no trainyard image is published. Build the Dockerfile's %s target, push it to your registry and set %s.image.repository (and %s.image.tag or .digest), e.g. --set %s.image.repository=registry.example.com/trainyard/%s (docs/install.md, \"Images\")" .key .target .key .key .key .target) }}
{{- end }}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/*
Name of the operator's leader-election Lease: the release's full name, so two
releases in one namespace never fight over one Lease.
*/}}
{{- define "trainyard.operator.leaseName" -}}
{{- include "trainyard.fullname" . }}
{{- end }}

{{/*
Name of the progress Service and of the Endpoints object behind it, which the
leader points at itself (--progress-endpoints). The release's full name, like
the Lease: one per release.
*/}}
{{- define "trainyard.operator.progressName" -}}
{{- printf "%s-progress" (include "trainyard.fullname" .) }}
{{- end }}

{{/* The Secret holding the key that seals the worker pods allowed to report (the operator makes it). */}}
{{- define "trainyard.operator.sealName" -}}
{{- printf "%s-worker-seal" (include "trainyard.fullname" .) }}
{{- end }}

{{/*
The URL trainers POST progress reports to (--progress-url): the progress
Service's fully qualified cluster DNS name, so it resolves from any namespace
whatever the pod's DNS search path.
*/}}
{{- define "trainyard.operator.progressURL" -}}
{{- printf "http://%s.%s.svc.%s:%d/v1/progress" (include "trainyard.operator.progressName" .) .Release.Namespace (default "cluster.local" .Values.clusterDomain) (int .Values.operator.progress.port) }}
{{- end }}

{{/*
Whether the operator serves the progress channel.
*/}}
{{- define "trainyard.operator.progressEnabled" -}}
{{- if and .Values.operator.enabled .Values.operator.progress.enabled }}true{{- end }}
{{- end }}

{{/*
Whether the device plugin serves fake GPUs.
*/}}
{{- define "trainyard.devicePlugin.fakeGpusEnabled" -}}
{{- if or .Values.devicePlugin.fakeGpus.enabled .Values.devicePlugin.fakeGpus.file .Values.devicePlugin.fakeGpus.hostDirectory }}true{{- end }}
{{- end }}

{{/*
Where the plugin reads the fake GPU file inside its container.
*/}}
{{- define "trainyard.devicePlugin.fakeGpusDir" -}}
/etc/trainyard
{{- end }}

{{/*
Fail early on value combinations the schema cannot express.
*/}}
{{- define "trainyard.validate" -}}
{{- if and .Values.operator.enabled (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection.enabled) }}
{{- fail "operator.replicas > 1 needs operator.leaderElection.enabled=true: two replicas without a Lease would both reconcile every TrainingJob" }}
{{- end }}
{{- if and (include "trainyard.operator.progressEnabled" .) (eq (int .Values.operator.progress.port) (int .Values.operator.metrics.port)) }}
{{- fail "operator.progress.port and operator.metrics.port must differ: the operator serves both, on separate listeners" }}
{{- end }}
{{- if and .Values.devicePlugin.fakeGpus.file .Values.devicePlugin.fakeGpus.hostDirectory }}
{{- fail "devicePlugin.fakeGpus.file and devicePlugin.fakeGpus.hostDirectory are exclusive: the file comes either from a ConfigMap or from the node" }}
{{- end }}
{{- end }}
