//! What a process does besides the pipeline: `run`, `serve`, `eval`, logs, metrics and traces.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RunSettings {
    pub max_open_questions: usize,
    pub max_question_chars: usize,
}

/// `lacuna serve`: the HTTP API and the live page (docs/serve.md).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSettings {
    pub listen: String,
    /// Questions accepted and not yet answered, at most; past it a POST gets 429 with Retry-After.
    pub max_open_questions: usize,
    /// Questions in one POST, at most.
    pub max_batch: usize,
    /// A larger request body gets 413.
    pub max_body_bytes: usize,
    /// A request body must arrive whole within this (408 otherwise), so a slow client cannot hold a
    /// handler and its buffer.
    pub body_timeout_ms: u64,
    /// The environment variable holding the bearer token the API requires; empty: no auth.
    pub token_env: String,
    /// The environment variable holding the token of the document routes (`/v1/documents`), a write
    /// scope of its own; empty: those routes are off.
    pub documents_token_env: String,
    /// Origins allowed to call the API from a browser (CORS); empty: none.
    pub cors_origins: Vec<String>,
    /// How long `POST /v1/answer` waits by default before answering 202 with the question's URL.
    pub answer_timeout_ms: u64,
    /// A question the bus has not taken within this is withdrawn (503 with Retry-After): its slot of
    /// `max_open_questions` and its `Idempotency-Key` are freed, whether or not its client waited.
    pub publish_timeout_ms: u64,
    /// Finished questions kept for `GET` (the oldest are forgotten first).
    pub keep_finished: usize,
    /// What the registry may hold, in bytes of events and records, whatever the count: past it the
    /// oldest finished questions, then other replicas' unfinished ones, are forgotten.
    pub registry_max_bytes: usize,
    /// Over Kafka: how far back in time a replica starting up reads the answers and progress topics.
    pub replay_window_s: u64,
    /// The Retry-After of a 429, and of a 503 past a cap below, in seconds.
    pub retry_after_s: u64,
    /// Open connections, at most; one past it is answered 503 with Retry-After and closed, so slow
    /// clients cannot take every file descriptor.
    pub max_connections: usize,
    /// Open event streams (`GET .../events`), at most; past it 503 with Retry-After.
    pub max_event_streams: usize,
    /// An event stream ends after this long even if its question has not (a client resumes with
    /// `Last-Event-ID`), so a question that never finishes holds no stream for ever.
    pub event_stream_max_s: u64,
    /// Over Kafka: this replica's name in its consumer groups (empty: the host name). Each replica
    /// reads every answer and progress partition in its own groups.
    pub replica_id: String,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub filter: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    pub listen: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSettings {
    pub judge_base_url: String,
    pub judge_model: String,
    pub judge_api_key_env: String,
}

/// `[otel]`: OpenTelemetry traces of every question, exported over OTLP (`telemetry/`,
/// docs/operations.md). Off without an endpoint.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OtelSettings {
    /// The OTLP endpoint: the collector's base URL for `http` (`/v1/traces` is added), its gRPC
    /// address for `grpc`. Empty: `OTEL_EXPORTER_OTLP_ENDPOINT` if set, else no traces.
    pub endpoint: String,
    pub protocol: OtelProtocol,
    /// The environment variable holding the exporter's headers, `key=value,key2=value2` (OTLP's own
    /// format), so API keys stay out of the configuration; empty: none.
    pub headers_env: String,
    /// The share of questions traced, 0 to 1: a question's first span decides, and every process
    /// it crosses follows that decision (the `traceparent`'s sampled flag).
    pub sampling_ratio: f64,
    /// Attributes of every span's resource besides `service.name` and `service.instance.id`, e.g.
    /// `{ "deployment.environment.name" = "prod" }`.
    pub resource_attributes: std::collections::BTreeMap<String, String>,
    /// Ended spans waiting for export, at most; past it new ones are dropped and counted
    /// (`lacuna_trace_spans_dropped_total`): a slow backend never holds a question up.
    pub queue_size: usize,
    /// Spans per export request, at most.
    pub batch_size: usize,
    /// A batch goes out at least this often.
    pub export_interval_ms: u64,
    /// One export request's limit; a batch that fails or passes it is dropped and counted.
    pub export_timeout_ms: u64,
    /// Prompt and completion text on LLM spans (the GenAI conventions' `gen_ai.input.messages` and
    /// `gen_ai.output.messages`). Off: prompts hold users' questions and passages.
    pub record_content: bool,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OtelProtocol {
    /// OTLP/HTTP with protobuf bodies.
    Http,
    /// OTLP/gRPC (plaintext).
    Grpc,
}
