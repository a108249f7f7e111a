{{/* Names and labels shared by the templates. */}}

{{- define "waltz.operatorName" -}}
{{- printf "%s-waltz-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The operator's Node reader ClusterRole: cluster-scoped, so the namespace is in it. */}}
{{- define "waltz.nodeReaderName" -}}
{{- printf "%s-%s-nodes" .Release.Namespace (include "waltz.operatorName" .) -}}
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
{{- $port := include "waltz.zookeeperClientPort" . -}}
{{- $hosts := list -}}
{{- range $i := until (int .Values.zookeeper.bundled.replicas) -}}
{{- $hosts = append $hosts (printf "%s-%d.%s-headless.%s.svc:%s" $name $i $name $.Release.Namespace $port) -}}
{{- end -}}
{{- join "," $hosts -}}
{{- end -}}
{{- end -}}

{{/* Whether the bundled ZooKeeper ensemble is installed. */}}
{{- define "waltz.bundledZookeeper" -}}
{{- if and (not .Values.zookeeper.connect) .Values.zookeeper.bundled.enabled -}}true{{- end -}}
{{- end -}}

{{/* Whether the bundled ZooKeeper serves TLS ("true" or ""). Fixed once the ensemble
exists (it says so in its annotation waltz.io/zookeeper-tls): one made without TLS
(before zookeeper.bundled.tls) keeps plain text on upgrade, and one made with it keeps
TLS. Switching would roll the nodes into two camps, and the clients' connect strings
(a WaltzCluster's is fixed) name the port. */}}
{{- define "waltz.zookeeperTls" -}}
{{- if include "waltz.bundledZookeeper" . -}}
{{- $existing := (lookup "apps/v1" "StatefulSet" .Release.Namespace (include "waltz.zookeeperName" .)) | default dict -}}
{{- if $existing -}}
{{- $annotations := (($existing.metadata | default dict).annotations | default dict) -}}
{{- if eq (get $annotations "waltz.io/zookeeper-tls" | toString) "true" -}}true{{- end -}}
{{- else if .Values.zookeeper.bundled.tls.enabled -}}true
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The bundled ZooKeeper's client port: 2281 over TLS, else 2181 in plain text. */}}
{{- define "waltz.zookeeperClientPort" -}}
{{- if include "waltz.zookeeperTls" . -}}2281{{- else -}}2181{{- end -}}
{{- end -}}

{{/* Prefix of the Secrets where the operator keeps the chart's own CA and certificates
(operator/waltz_operator/system_pki.py): <prefix>-ca, -ca-cert, -zookeeper-tls and
-operator-tls, in the release namespace. */}}
{{- define "waltz.systemPki" -}}
{{- printf "%s-waltz-system" .Release.Name -}}
{{- end -}}

{{/* Whether the operator keeps that PKI: for ZooKeeper's TLS or its own HTTPS. */}}
{{- define "waltz.systemPkiEnabled" -}}
{{- if or (include "waltz.zookeeperTls" .) .Values.operator.metricsTls -}}true{{- end -}}
{{- end -}}

{{/* The Secret the chart's cluster and helm test reach ZooKeeper's TLS port with: the
given one, else the chart's CA certificate (only ca.crt) when the bundled ZooKeeper is
on TLS, else none. */}}
{{- define "waltz.zookeeperTlsSecret" -}}
{{- if .Values.cluster.zookeeperTlsSecret -}}{{ .Values.cluster.zookeeperTlsSecret }}
{{- else if include "waltz.zookeeperTls" . -}}{{ include "waltz.systemPki" . }}-ca-cert
{{- end -}}
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
{{- else if eq (include "waltz.tlsMode" .) "operator" -}}{{ printf "%s-client-tls" .Values.cluster.name }}
{{- end -}}
{{- end -}}

{{/* The WaltzCluster's spec.tls.mode: secrets when Secrets are given or cert-manager
issues them; else the mode of the cluster if it exists (fixed once set; one made before
the field runs in plain text); else cluster.tls.mode (operator or disabled). */}}
{{- define "waltz.tlsMode" -}}
{{- $existing := (lookup "waltz.io/v1alpha1" "WaltzCluster" .Release.Namespace .Values.cluster.name) | default dict -}}
{{- $tls := ($existing.spec | default dict).tls | default dict -}}
{{- if include "waltz.storageTlsSecret" . -}}secrets
{{- else if $tls.mode -}}{{ $tls.mode }}
{{- else if $existing -}}disabled
{{- else -}}{{ .Values.cluster.tls.mode }}
{{- end -}}
{{- end -}}

{{/* Waltz's own pods (the operator, the clusters' pods, helm test) in the namespaces
the operator watches: a NetworkPolicyPeer. */}}
{{- define "waltz.ownPods" -}}
{{- if .Values.operator.watch.clusterWide -}}
namespaceSelector: {}
{{- else -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values:
        {{- range splitList "," (include "waltz.watchedNamespaces" .) }}
        - {{ . | quote }}
        {{- end }}
{{- end }}
podSelector:
  matchLabels:
    app.kubernetes.io/part-of: waltz
{{- end -}}

{{/* A WaltzCluster tier's pod fields from its values (those that are set). */}}
{{- define "waltz.tierPod" -}}
{{- $pod := dict -}}
{{- range $key := list "resources" "affinity" "tolerations" "topologySpreadConstraints" "priorityClassName" -}}
{{- with get $ $key -}}
{{- $_ := set $pod $key . -}}
{{- end -}}
{{- end -}}
{{- with $pod -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/* A memory quantity ("1Gi", "1536Mi", "2G", "1073741824") in MiB, as a float; fails
naming `what` when it cannot be read. Call with (list quantity what). */}}
{{- define "waltz.mebibytes" -}}
{{- $what := index . 1 -}}
{{- if or (kindIs "float64" (index . 0)) (kindIs "int64" (index . 0)) (kindIs "int" (index . 0)) -}}
{{- divf (float64 (index . 0)) 1048576.0 -}}
{{- else -}}
{{- $q := toString (index . 0) -}}
{{- $factors := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- if not (regexMatch "^[0-9]+(\\.[0-9]+)?(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$" $q) -}}
{{- fail (printf "%s: cannot read %q as a memory quantity (a number with an optional suffix Ki, Mi, Gi, Ti, k, M, G, T)" $what $q) -}}
{{- end -}}
{{- $number := float64 (regexFind "^[0-9]+(\\.[0-9]+)?" $q) -}}
{{- $suffix := regexReplaceAll "^[0-9]+(\\.[0-9]+)?" $q "" -}}
{{- divf (mulf $number (get $factors $suffix)) 1048576.0 -}}
{{- end -}}
{{- end -}}
