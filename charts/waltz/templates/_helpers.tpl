{{/* Names and labels shared by the templates. */}}

{{- define "waltz.operatorName" -}}
{{- printf "%s-waltz-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "waltz.serviceAccountName" -}}
{{- if .Values.serviceAccount.name -}}
{{- .Values.serviceAccount.name -}}
{{- else -}}
{{- include "waltz.operatorName" . -}}
{{- end -}}
{{- end -}}

{{- define "waltz.zookeeperName" -}}
{{- printf "%s-zookeeper" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object of the release carries. */}}
{{- define "waltz.labels" -}}
app.kubernetes.io/part-of: waltz
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The operator pod's selector labels. */}}
{{- define "waltz.operatorSelector" -}}
app.kubernetes.io/name: waltz-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The ZooKeeper pods' selector labels. */}}
{{- define "waltz.zookeeperSelector" -}}
app.kubernetes.io/name: zookeeper
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Namespaces the operator watches (not cluster-wide): the release's and the listed. */}}
{{- define "waltz.watchedNamespaces" -}}
{{- $namespaces := list .Release.Namespace -}}
{{- range .Values.operator.watch.namespaces -}}
{{- if not (has . $namespaces) -}}
{{- $namespaces = append $namespaces . -}}
{{- end -}}
{{- end -}}
{{- join "," $namespaces -}}
{{- end -}}

{{/* ZooKeeper's connect string: the given one, else the bundled ensemble's. */}}
{{- define "waltz.zookeeperConnect" -}}
{{- if .Values.zookeeper.connect -}}
{{- .Values.zookeeper.connect -}}
{{- else -}}
{{- $name := include "waltz.zookeeperName" . -}}
{{- $hosts := list -}}
{{- range $i := until (int .Values.zookeeper.bundled.replicas) -}}
{{- $hosts = append $hosts (printf "%s-%d.%s-headless.%s.svc:2181" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $hosts -}}
{{- end -}}
{{- end -}}

{{/* Whether the bundled ZooKeeper ensemble is installed. */}}
{{- define "waltz.bundledZookeeper" -}}
{{- if and (not .Values.zookeeper.connect) .Values.zookeeper.bundled.enabled -}}true{{- end -}}
{{- end -}}


{{/* The cluster's TLS Secrets: given, or issued by cert-manager (empty: no TLS). */}}
{{- define "waltz.storageTlsSecret" -}}
{{- if .Values.cluster.tls.storageSecret -}}{{ .Values.cluster.tls.storageSecret }}
{{- else if .Values.cluster.certManager.enabled -}}{{ printf "%s-storage-tls" .Values.cluster.name }}
{{- end -}}
{{- end -}}

{{- define "waltz.serverTlsSecret" -}}
{{- if .Values.cluster.tls.serverSecret -}}{{ .Values.cluster.tls.serverSecret }}
{{- else if .Values.cluster.certManager.enabled -}}{{ printf "%s-server-tls" .Values.cluster.name }}
{{- end -}}
{{- end -}}

{{- define "waltz.testTlsSecret" -}}
{{- if .Values.test.tlsSecret -}}{{ .Values.test.tlsSecret }}
{{- else if .Values.cluster.certManager.enabled -}}{{ printf "%s-check-tls" .Values.cluster.name }}
{{- end -}}
{{- end -}}
