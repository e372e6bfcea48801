//! The bodies and parameters of `lacuna serve`'s routes: what a client sends and what it gets back,
//! each a type whose schema in the OpenAPI document is derived from it. Some exist only for the
//! document (a route reads its body itself, so that a bad one gets the JSON 400 every refusal has).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::http::ErrorBody;

/// One question as a client sends it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// Your own id: the same id again returns the same question, never a second one.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub id: Option<String>,
    /// The question: not blank, at most `run.max_question_chars` characters (2000 by default).
    #[schema(min_length = 1, max_length = 2000, pattern = "\\S")]
    pub question: String,
    /// One of the pipelines this server runs (`GET /v1/stages` lists them); default: the first.
    #[serde(default)]
    #[schema(value_type = Option<PipelineName>)]
    pub pipeline: Option<String>,
    /// The answer must be "yes" or "no".
    #[serde(default)]
    pub yes_no: bool,
}

/// The pipelines Lacuna has; a server runs those `lacuna serve --pipeline` names.
#[derive(ToSchema)]
#[schema(as = PipelineName)]
#[serde(rename_all = "kebab-case")]
pub enum PipelineName {
    Migres,
    Vanilla,
    VanillaS,
    Qpaug,
    Raisf,
    Rqrag,
}

/// Several questions in one request: all accepted or none.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// At most `serve.max_batch` (100 by default), their ids distinct.
    #[schema(min_items = 1, max_items = 100)]
    pub questions: Vec<Question>,
    /// The pipeline of questions that name none.
    #[serde(default)]
    #[schema(value_type = Option<PipelineName>)]
    pub pipeline: Option<String>,
}

/// What `POST /v1/questions` takes.
#[derive(ToSchema)]
#[serde(untagged)]
pub enum Submission {
    One(Question),
    Batch(Batch),
}

/// What `POST /v1/answer` takes: one question, and how long to wait for its record.
#[derive(ToSchema)]
pub struct AnswerRequest {
    #[serde(flatten)]
    pub question: Question,
    /// Milliseconds to wait; default `serve.answer_timeout_ms`.
    #[schema(maximum = 86_400_000)]
    pub timeout_ms: Option<u64>,
}

/// The questions a request submitted.
#[derive(Serialize, ToSchema)]
pub struct Accepted {
    /// The question's id, when one question was posted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Its URL, when one question was posted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    pub questions: Vec<AcceptedQuestion>,
}

#[derive(Serialize, ToSchema)]
pub struct AcceptedQuestion {
    pub id: String,
    pub location: String,
    /// Asked before (same id or Idempotency-Key): nothing new was submitted.
    pub duplicate: bool,
}

/// `POST /v1/answer` past its wait: the question goes on.
#[derive(Serialize, ToSchema)]
pub struct StillRunning {
    pub id: String,
    pub location: String,
    /// `running`.
    pub status: String,
    pub message: String,
}

/// The newest questions.
#[derive(Serialize, ToSchema)]
pub struct QuestionList {
    /// Questions accepted here and not finished.
    pub open: usize,
    /// Up to 200, newest first.
    pub questions: Vec<Summary>,
}

/// Where the open questions are.
#[derive(Serialize, ToSchema)]
pub struct Stages {
    /// `in-process` or `kafka`.
    pub transport: &'static str,
    /// The default pipeline first.
    pub pipelines: Vec<String>,
    pub open: usize,
    pub max_open: usize,
    /// Open questions no stage has taken yet.
    pub not_started: usize,
    pub stages: Vec<StageLoad>,
    /// In process, the queues that hold events.
    pub topics: Vec<TopicQueue>,
    pub ready: bool,
}

#[derive(Serialize, ToSchema)]
pub struct StageLoad {
    pub stage: &'static str,
    /// Open questions whose latest step is this stage's.
    pub questions: usize,
    /// In process, the events it is working on.
    pub in_flight: Option<i64>,
}

#[derive(Serialize, ToSchema)]
pub struct TopicQueue {
    pub topic: &'static str,
    pub queued: i64,
}

/// One Server-Sent Event of a question's stream.
#[derive(ToSchema)]
pub struct StreamEvent {
    /// Its index in the question's stream: resume after it with `Last-Event-ID`.
    #[schema(pattern = "^[0-9]+$")]
    pub id: String,
    /// `accepted`, `iteration`, a trace step's kind, or `record`.
    pub event: String,
    /// JSON: `{id, question, pipeline}` for `accepted`, `{node, iteration}`, `{node, step}` for a
    /// step, the record for `record`.
    #[schema(content_media_type = "application/json")]
    pub data: String,
}

/// The `Idempotency-Key` header (documentation only: the handlers read the header themselves, so
/// that a bad one gets the JSON 400 every refusal has).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyKey {
    /// The same key returns the same question, on any replica (in a batch, question i is keyed
    /// <key>#i). A question with a key and no id gets the id k- followed by 32 hex digits of the
    /// key's SHA-256.
    #[serde(rename = "Idempotency-Key")]
    #[param(required = false, min_length = 1, max_length = 200, pattern = "^[\\t\\x20-\\x7e]+$")]
    pub idempotency_key: String,
}

/// The W3C `traceparent` header (documentation only, like [`IdempotencyKey`]): the questions join
/// the caller's trace, and their records name it (`provenance.trace_id`). One that is not a valid
/// trace context is ignored, as the W3C specification asks.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct TraceParent {
    /// `00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`.
    #[serde(rename = "traceparent")]
    #[param(required = false, example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
    pub traceparent: Option<String>,
}

/// Where a stream resumes: after the event with this id, from the `Last-Event-ID` header or, for
/// clients that cannot set headers, the `last_event_id` query parameter. Documentation only: both
/// are read by [`resume_from`], so that a bad one gets the JSON 400 every refusal has.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct ResumeHeader {
    /// Resume after this event.
    #[param(rename = "Last-Event-ID", value_type = u32, required = false)]
    pub last_event_id: String,
}

#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ResumeQuery {
    /// Resume after this event (the header wins when both are given).
    #[param(value_type = u32, required = false)]
    pub last_event_id: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct QuestionId {
    /// The question's id.
    pub id: String,
}

/// A question's record, once done; else where it stands and its steps so far.
#[derive(ToSchema)]
#[serde(untagged)]
pub enum QuestionView {
    Done(crate::topics::VersionedAnswer),
    Running(Progress),
}

/// Why a submission (`POST /v1/questions`, `POST /v1/answer`) is refused.
#[derive(utoipa::IntoResponses)]
pub enum SubmitRefused {
    /// The body is not a question or a batch of them, or one of them is refused (blank, too long,
    /// a bad id, a pipeline not served here, two of the same id); `POST /v1/answer` takes one
    /// question, and its `timeout_ms` must be a whole number.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// A token is configured and the request does not carry it.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// The body did not arrive within serve.body_timeout_ms.
    #[response(status = 408)]
    Timeout(ErrorBody),
    /// The id was asked before with another question, or (with Retry-After) an earlier request
    /// with the same id or Idempotency-Key is still publishing it.
    #[response(status = 409)]
    Conflict(ErrorBody),
    /// The body is over serve.max_body_bytes, or a question is over the bus's message size (no retry
    /// helps; `accepted` lists those of the batch it took).
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// The request does not say its body is application/json.
    #[response(status = 415)]
    UnsupportedMediaType(ErrorBody),
    /// serve.max_open_questions are open: retry after Retry-After seconds.
    #[response(status = 429, headers(("Retry-After" = u64, description = "Seconds to wait.")))]
    TooManyOpen(ErrorBody),
    /// The bus refused a question for good (not authorised, no such topic): for the operator, not
    /// worth a retry; `accepted` lists those of the batch it took.
    #[response(status = 500)]
    Refused(ErrorBody),
    /// The bus did not take a question now; retry after Retry-After seconds. `accepted` lists those
    /// of the batch it took.
    #[response(status = 503, headers(("Retry-After" = u64, description = "Seconds to wait.")))]
    Unavailable(ErrorBody),
}

/// The refusal every /v1 route may answer.
#[derive(utoipa::IntoResponses)]
pub enum NeedsToken {
    /// A token is configured and the request does not carry it.
    #[response(status = 401)]
    Unauthorized(ErrorBody),
}

/// Where a question stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum QuestionStatus {
    /// Accepted, no step seen yet.
    Queued,
    Running,
    Answered,
    Error,
}

/// One line of `GET /v1/questions`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Summary {
    pub id: String,
    /// Empty for a question another replica accepted, until its record comes.
    pub question: String,
    pub pipeline: String,
    pub status: QuestionStatus,
    /// The stage of the latest step.
    pub stage: String,
    /// The answer, once answered.
    pub answer: Option<String>,
    /// Events in its stream so far.
    pub events: usize,
}

/// A question not done yet: where it stands and the steps so far.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Progress {
    pub id: String,
    pub question: String,
    pub pipeline: String,
    pub status: QuestionStatus,
    /// The stage of the latest step.
    pub stage: String,
    pub steps: Vec<NodeStep>,
}

/// One trace step of one node of the question's tree ("root", "1", "1.2").
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct NodeStep {
    pub node: String,
    /// The step: stage, iteration and a `kind` with its fields (the record's `trace[]` items).
    #[schema(value_type = Object)]
    pub step: Value,
}
