{{/* <release>-operator unless overridden; every operator resource is named by it. */}}
{{- define "finetunejob.name" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (default "operator" .Values.nameOverride) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "finetunejob.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end -}}

{{- define "finetunejob.labels" -}}
app.kubernetes.io/name: finetunejob
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "finetunejob.selector" -}}
app.kubernetes.io/name: finetunejob
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* What the operator needs, and nothing more: no Secrets, no pods/exec, no wildcards. */}}
{{- define "finetunejob.rules" -}}
- apiGroups: ["finetunejob.dev"]
  resources: ["finetunejobs"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: ["finetunejob.dev"]
  resources: ["finetunejobs/status"]
  verbs: ["get", "patch"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Pods are listed to explain a failed or waiting attempt; never watched (the Job's status counts them).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list"]
- apiGroups: [""]
  resources: ["configmaps", "services", "serviceaccounts"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Why a gang waits: the Job controller's FailedCreate events (quota), listed only for waiting jobs.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list"]
{{- if .Values.networkPolicy.enabled }}
# networkPolicy.enabled: each gang gets a NetworkPolicy, owned by its FineTuneJob.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
{{- end }}
# A new job asking for more GPUs than the namespace's ResourceQuota allows fails at once (QuotaTooSmall).
- apiGroups: [""]
  resources: ["resourcequotas"]
  verbs: ["get", "list"]
# Runtimes in the jobs' namespaces (read when a job starts: spec.runtimeRef or the namespace's default).
- apiGroups: ["finetunejob.dev"]
  resources: ["finetuneruntimes"]
  verbs: ["get", "list"]
# Kueue (when installed): the Workloads of our Jobs say why a queued job waits; a suspend of a Kueue-managed job
# deactivates its Workload (spec.active) instead of fighting Kueue over the Job's spec.suspend.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "patch"]
{{- end -}}
