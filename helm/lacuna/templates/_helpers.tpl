{{/* Names and labels shared by every resource. */}}
{{- define "lacuna.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "lacuna.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
lacuna.dev/pipeline: {{ .Values.pipeline }}
{{- end -}}

{{/* A stage's resource name: Kubernetes names allow no underscores. Call with (list $ "stage_name"). */}}
{{- define "lacuna.stageName" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "lacuna.fullname" $root) (index . 1 | replace "_" "-") | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "lacuna.stageSelector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 | replace "_" "-" }}
{{- end -}}

{{/* Topic and consumer-group prefix: pipelines other than MIGRES get their own (see PipelineKind::kafka_settings). */}}
{{- define "lacuna.topicPrefix" -}}
{{- if eq .Values.pipeline "migres" -}}
{{- .Values.kafka.topicPrefix -}}
{{- else -}}
{{- printf "%s%s." .Values.kafka.topicPrefix .Values.pipeline -}}
{{- end -}}
{{- end -}}

{{/* The stages that must run as one replica: the join reads its whole state on start (actors/join.rs). */}}
{{- define "lacuna.singletons" -}}
{{- list "join" | toJson -}}
{{- end -}}

{{/* The most replicas a stage can use: one per partition. Call with (list $ wanted). */}}
{{- define "lacuna.cappedReplicas" -}}
{{- $root := index . 0 -}}
{{- min (int (index . 1)) (int $root.Values.kafka.partitions) -}}
{{- end -}}

{{/* lacuna.toml: values.config with the chart's Kafka, LLM, metrics and index settings laid over it. */}}
{{- define "lacuna.config" -}}
{{- $config := deepCopy (default dict .Values.config) -}}
{{- $kafka := dict "brokers" .Values.kafka.brokers "topic_prefix" .Values.kafka.topicPrefix "partitions" (int .Values.kafka.partitions) "replication_factor" (int .Values.kafka.replicationFactor) -}}
{{- $_ := set $config "kafka" (merge $kafka (default dict $config.kafka)) -}}
{{- $llm := dict "base_url" .Values.llm.baseUrl "model" .Values.llm.model -}}
{{- $_ := set $config "llm" (merge $llm (default dict $config.llm)) -}}
{{- $_ := set $config "metrics" (dict "listen" (printf "0.0.0.0:%d" (int .Values.metrics.port))) -}}
{{- $search := dict "index_dir" .Values.index.mountPath -}}
{{- $_ := set $config "search" (merge $search (default dict $config.search)) -}}
{{- toToml $config -}}
{{- end -}}

{{/* The stages of each pipeline (pipelines/*.rs): a stage enabled outside its pipeline is an error. */}}
{{- define "lacuna.pipelineStages" -}}
{{- $stages := dict "migres" (list "retrieve" "sentence_filter" "leaf" "verify" "main" "query_gen") "vanilla" (list "retrieve" "sentence_filter" "reader") "vanilla-s" (list "retrieve" "sentence_filter" "reader") -}}
{{- $_ := set $stages "qpaug" (list "augment" "retrieve" "sentence_filter" "reader") -}}
{{- $_ := set $stages "raisf" (list "self_knowledge" "retrieve" "sentence_filter" "relevance" "join" "compose") -}}
{{- $_ := set $stages "rqrag" (list "retrieve" "sentence_filter" "refine" "join" "select") -}}
{{- $known := get $stages .Values.pipeline -}}
{{- if not $known -}}
{{- fail (printf "pipeline must be one of %s, not %q" (keys $stages | sortAlpha | join ", ") .Values.pipeline) -}}
{{- end -}}
{{- range $name, $stage := .Values.stages -}}
{{- if and $stage.enabled (not (has $name $known)) -}}
{{- fail (printf "stage %s is not part of pipeline %s (its stages: %s); set stages.%s.enabled=false" $name $.Values.pipeline (join ", " $known) $name) -}}
{{- end -}}
{{- end -}}
{{- range $known -}}
{{- if not (dig . "enabled" false $.Values.stages) -}}
{{- fail (printf "pipeline %s needs stage %s: set stages.%s.enabled=true" $.Values.pipeline . .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
