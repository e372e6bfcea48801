//! The routes of `lacuna serve`, each a typed handler whose `utoipa::path` attribute is its part of
//! the OpenAPI document (`serve/openapi.rs`):
//! - `POST /v1/questions`: one question or a batch; 202 with the ids at once, `Location` the first's;
//! - `GET /v1/questions`: the newest questions and where each stands (the live page's list);
//! - `GET /v1/questions/{id}`: the record when done, else the status and the steps so far;
//! - `GET /v1/questions/{id}/events`: the steps as Server-Sent Events, ending with the record;
//! - `POST /v1/answer`: one question, waiting for its record (202 and its URL past the timeout);
//! - `GET /v1/stages`: open questions by stage, and in process what each stage has in flight;
//! - `/v1/documents`: the live corpus, behind a token of its own (`documents.rs`);
//! - `/` (the live page), `/openapi.json`, `/metrics`, `/healthz`, `/readyz`, without auth.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use super::bodies::{
    Accepted, AcceptedQuestion, AnswerRequest, Batch, IdempotencyKey, NeedsToken, Question, QuestionId, QuestionList,
    QuestionView, ResumeHeader, ResumeQuery, StageLoad, Stages, StillRunning, StreamEvent, Submission, SubmitRefused,
    TopicQueue, TraceParent,
};
use super::http::{
    ApiError, ErrorBody, ErrorCode, bearer_matches, json_reply, parse_json, read_body, require_json, with_location,
};
use super::registry::{AdmitError, Admitted, Events, NewQuestion, Registry};
use crate::config::ServeSettings;
use crate::metrics::METRICS;
use crate::pipelines::Transport;
use crate::pipelines::input::checked_question;
use crate::topics::bus::BusError;
use crate::topics::{Bus, Event, Topic};

const PAGE: &str = include_str!("page.html");

/// A stream with nothing new still sends a comment this often, so proxies keep it open.
const KEEPALIVE: Duration = Duration::from_secs(15);

pub struct Api {
    pub registry: Arc<Registry>,
    /// Where each served pipeline's questions go.
    pub buses: BTreeMap<String, Arc<dyn Bus>>,
    pub default_pipeline: String,
    pub settings: ServeSettings,
    /// The bearer token /v1 requires, if any.
    pub token: Option<String>,
    pub max_question_chars: usize,
    pub transport: Transport,
    pub stage_names: Vec<&'static str>,
    pub ready: Arc<AtomicBool>,
    /// One permit per open event stream (`serve.max_event_streams`).
    pub streams: Arc<tokio::sync::Semaphore>,
    /// The document routes' own token and target.
    pub documents: Arc<super::documents::DocumentRoutes>,
}

/// Ids travel in URLs and Kafka keys: letters, digits and `._:-`, at most 128 of them.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c))
}

fn location(id: &str) -> String {
    format!("/v1/questions/{id}")
}

/// With a token configured, /v1 needs `Authorization: Bearer <token>`. The digests are compared in
/// constant time, so neither the token's bytes nor its length leak through timing.
pub async fn authorize(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    let Some(token) = &api.token else { return next.run(request).await };
    if bearer_matches(request.headers(), token) {
        return next.run(request).await;
    }
    ApiError::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, "this API needs Authorization: Bearer <token>")
        .into_response()
}

impl Api {
    /// Reads a JSON body into questions, checked: 400 with the first problem otherwise. `extra`
    /// names options of the route itself (`timeout_ms`), taken out before the questions are read.
    async fn read_questions(
        &self,
        headers: &HeaderMap,
        body: Body,
        extra: &[&str],
    ) -> Result<(Vec<NewQuestion>, Value), ApiError> {
        let key = headers.get("idempotency-key").map(|v| v.to_str().map(str::to_string));
        let key = match key {
            Some(Ok(key)) if !key.is_empty() && key.len() <= 200 => Some(key),
            Some(_) => return Err(ApiError::bad_request("Idempotency-Key must be 1 to 200 visible ASCII characters")),
            None => None,
        };
        require_json(headers)?;
        let deadline = Duration::from_millis(self.settings.body_timeout_ms);
        let body = read_body(headers, body, self.settings.max_body_bytes, deadline).await?;
        let mut value = parse_json(&body)?;
        let mut options = json!({});
        if let Some(object) = value.as_object_mut() {
            for name in extra {
                if let Some(option) = object.remove(*name) {
                    options[*name] = option;
                }
            }
        }
        let (bodies, default_pipeline, batch) = if value.get("questions").is_some() {
            let batch: Batch =
                serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("a batch: {e}")))?;
            (batch.questions, batch.pipeline, true)
        } else {
            let one: Question = serde_json::from_value(value).map_err(|e| {
                ApiError::bad_request(format!("expected {{\"question\": \"...\"}} or {{\"questions\": [...]}}: {e}"))
            })?;
            (vec![one], None, false)
        };
        if bodies.is_empty() || bodies.len() > self.settings.max_batch {
            return Err(ApiError::bad_request(format!(
                "a request holds 1 to {} questions (serve.max_batch)",
                self.settings.max_batch
            )));
        }
        let mut questions = Vec::new();
        for (i, body) in bodies.into_iter().enumerate() {
            let at = if batch { format!("questions[{i}]: ") } else { String::new() };
            let question = checked_question(&body.question, self.max_question_chars)
                .map_err(|message| ApiError::bad_request(format!("{at}{message}")))?;
            if let Some(id) = &body.id
                && !valid_id(id)
            {
                return Err(ApiError::bad_request(format!("{at}id {id:?}: use 1 to 128 letters, digits or ._:-")));
            }
            let pipeline = body.pipeline.or(default_pipeline.clone()).unwrap_or_else(|| self.default_pipeline.clone());
            if !self.buses.contains_key(&pipeline) {
                let served: Vec<&String> = self.buses.keys().collect();
                return Err(ApiError::bad_request(format!(
                    "{at}pipeline {pipeline:?} is not served here (served: {served:?})"
                )));
            }
            let key = key.as_ref().map(|k| if batch { format!("{k}#{i}") } else { k.clone() });
            questions.push(NewQuestion { id: body.id, key, question, pipeline, yes_no: body.yes_no });
        }
        let ids: Vec<&String> = questions.iter().filter_map(|q| q.id.as_ref()).collect();
        if ids.iter().collect::<HashSet<_>>().len() < ids.len() {
            return Err(ApiError::bad_request("two questions of the batch have the same id"));
        }
        Ok((questions, options))
    }

    /// Admits the questions and publishes the new ones; each id with whether it was new. A question
    /// counts as accepted only once the bus took it (over Kafka: the broker acknowledged it).
    async fn submit(
        &self,
        questions: Vec<NewQuestion>,
        traceparent: Option<&str>,
    ) -> Result<Vec<(String, bool)>, ApiError> {
        let pipelines: Vec<String> = questions.iter().map(|q| q.pipeline.clone()).collect();
        let admitted = self.registry.admit(questions).map_err(|error| match error {
            AdmitError::TooManyOpen { .. } => {
                let mut refused = ApiError::new(StatusCode::TOO_MANY_REQUESTS, ErrorCode::TooManyOpen, &error);
                refused.retry_after = Some(self.settings.retry_after_s);
                refused
            }
            AdmitError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, &error),
            AdmitError::Publishing(_) => {
                let mut refused = ApiError::new(StatusCode::CONFLICT, ErrorCode::Conflict, &error);
                refused.retry_after = Some(1);
                refused
            }
        })?;
        let publishing = Publishing {
            registry: self.registry.clone(),
            buses: self.buses.clone(),
            traceparent: traceparent.map(str::to_string),
            timeout: Duration::from_millis(self.settings.publish_timeout_ms),
            retry_after_s: self.settings.retry_after_s,
        };
        // In a task of its own: a client that gives up drops this handler, and a publish dropped
        // half-way would leave its question counted open and its key bound, though never sent. The
        // task settles every question either way: taken by the bus, or withdrawn.
        tokio::spawn(publishing.run(admitted.into_iter().zip(pipelines).collect())).await.unwrap_or_else(|error| {
            let message = format!("publishing stopped: {error}");
            Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Unavailable, message))
        })
    }

    fn unknown(id: &str) -> ApiError {
        ApiError::not_found(format!("no question {id} here (never asked, or forgotten: serve.keep_finished)"))
    }
}

/// What publishing a request's admitted questions needs, owned: it outlives the request.
struct Publishing {
    registry: Arc<Registry>,
    buses: BTreeMap<String, Arc<dyn Bus>>,
    traceparent: Option<String>,
    /// `serve.publish_timeout_ms`, for each question.
    timeout: Duration,
    retry_after_s: u64,
}

impl Publishing {
    /// Publishes the new questions in order; at the first the bus does not take (an error, or no
    /// answer within the timeout) it withdraws that one and those after it.
    async fn run(self, admitted: Vec<(Admitted, String)>) -> Result<Vec<(String, bool)>, ApiError> {
        let mut ids = Vec::new();
        let mut unpublished: Vec<String> = admitted
            .iter()
            .filter_map(|(a, _)| match a {
                Admitted::New(q) => Some(q.id.clone()),
                Admitted::Existing(_) => None,
            })
            .collect();
        for (admitted, pipeline) in admitted {
            let question = match admitted {
                Admitted::Existing(id) => {
                    ids.push((id, false));
                    continue;
                }
                Admitted::New(question) => question,
            };
            let id = question.id.clone();
            let mut record = question.to_record();
            record.trace = crate::telemetry::question_headers(&id, self.traceparent.as_deref());
            let published = match tokio::time::timeout(self.timeout, self.buses[&pipeline].publish(record)).await {
                Ok(published) => published,
                Err(_) => Err(BusError::Transport(format!("not taken within {:?}", self.timeout))),
            };
            if let Err(error) = published {
                for id in &unpublished {
                    self.registry.withdraw(id);
                }
                // Those published before the failure were accepted: say which.
                let accepted = ids.iter().filter(|(_, new)| *new).map(|(id, _)| id.clone()).collect();
                let mut refused = ApiError::publish_failed(&error, &format!("question {id}"), self.retry_after_s);
                refused.body.accepted = Some(accepted);
                return Err(refused);
            }
            self.registry.published(&id);
            unpublished.retain(|u| *u != id);
            ids.push((id, true));
        }
        Ok(ids)
    }
}

/// Submit one question or a batch; returns the ids at once.
#[utoipa::path(
    post,
    path = "/v1/questions",
    tag = "questions",
    params(IdempotencyKey, TraceParent),
    request_body(content = Submission, content_type = "application/json"),
    responses(
        (status = 202, description = "Accepted; Location is the first question's URL.", body = Accepted,
            headers(("Location" = String, description = "The first question's URL."))),
        SubmitRefused,
    )
)]
pub async fn post_questions(State(api): State<Arc<Api>>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (questions, _) = api.read_questions(&headers, body, &[]).await?;
    let ids = api.submit(questions, trace_parent(&headers)).await?;
    let listed = ids
        .iter()
        .map(|(id, new)| AcceptedQuestion { id: id.clone(), location: location(id), duplicate: !new })
        .collect();
    let one = (ids.len() == 1).then(|| ids[0].0.clone());
    let accepted = Accepted { location: one.as_deref().map(location), id: one, questions: listed };
    Ok(with_location(json_reply(StatusCode::ACCEPTED, &accepted), &location(&ids[0].0)))
}

/// Submit one question and wait for its record.
#[utoipa::path(
    post,
    path = "/v1/answer",
    tag = "questions",
    params(IdempotencyKey, TraceParent),
    request_body(content = AnswerRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The record.", body = crate::topics::VersionedAnswer),
        (status = 202, description = "No record within the timeout: the question goes on; GET its Location.", body = StillRunning,
            headers(("Location" = String, description = "The question's URL."))),
        SubmitRefused,
    )
)]
pub async fn answer(State(api): State<Arc<Api>>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (questions, options) = api.read_questions(&headers, body, &["timeout_ms"]).await?;
    if questions.len() != 1 {
        return Err(ApiError::bad_request("POST /v1/answer takes one question; POST /v1/questions takes batches"));
    }
    let timeout = match &options["timeout_ms"] {
        Value::Null => api.settings.answer_timeout_ms,
        value => value.as_u64().ok_or_else(|| ApiError::bad_request("timeout_ms must be a whole number"))?,
    };
    let ids = api.submit(questions, trace_parent(&headers)).await?;
    let id = &ids[0].0;
    if let Some(record) = api.registry.wait_record(id, Duration::from_millis(timeout)).await {
        return Ok(json_reply(StatusCode::OK, &record));
    }
    let running = StillRunning {
        id: id.clone(),
        location: location(id),
        status: "running".into(),
        message: format!("no record within {timeout} ms: GET the location"),
    };
    Ok(with_location(json_reply(StatusCode::ACCEPTED, &running), &location(id)))
}

/// The newest questions (up to 200) and where each stands.
#[utoipa::path(
    get,
    path = "/v1/questions",
    tag = "questions",
    responses(
        (status = 200, description = "How many are open, and the newest questions.", body = QuestionList),
        NeedsToken,
    )
)]
pub async fn list_questions(State(api): State<Arc<Api>>) -> Response {
    json_reply(StatusCode::OK, &QuestionList { open: api.registry.open(), questions: api.registry.list(200) })
}

/// The record when done; else the status and the steps so far.
#[utoipa::path(
    get,
    path = "/v1/questions/{id}",
    tag = "questions",
    params(QuestionId),
    responses(
        (status = 200, description = "A record, or progress.", body = QuestionView),
        NeedsToken,
        (status = 404, description = "Never asked here, or forgotten (serve.keep_finished).", body = ErrorBody),
    )
)]
pub async fn get_question(State(api): State<Arc<Api>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let body = api.registry.get(&id).ok_or_else(|| Api::unknown(&id))?;
    Ok(json_reply(StatusCode::OK, &body))
}

/// The question's steps as Server-Sent Events, ending with its record.
///
/// Events, each with an id: `accepted`, `iteration` (a node's new iteration), one per trace step
/// named by its kind (`queries_written`, `retrieved`, `passage_scored`, `sentences_kept`,
/// `fact_proposed`, `verdict`, `fact_kept`, `fact_dropped`, `decision`, `fanned_out`, `joined`,
/// `selected`, `llm_call`, ...; data `{node, step}`), and last `record` (data: the record). A comment
/// keeps an idle stream open. Reconnect with `Last-Event-ID` (or `?last_event_id=`) to resume after
/// that event.
#[utoipa::path(
    get,
    path = "/v1/questions/{id}/events",
    tag = "questions",
    params(QuestionId, ResumeHeader, ResumeQuery),
    responses(
        (status = 200, description = "The event stream: lines of `id: N`, `event: NAME` and `data: JSON`, each event ending in a blank line.",
            content_type = "text/event-stream", body = StreamEvent),
        (status = 400, description = "Last-Event-ID is not an event id.", body = ErrorBody),
        NeedsToken,
        (status = 404, description = "Never asked here, or forgotten (serve.keep_finished).", body = ErrorBody),
        (status = 503, description = "serve.max_event_streams streams are open; retry after Retry-After seconds.",
            headers(("Retry-After" = u64, description = "Seconds to wait")), body = ErrorBody),
    )
)]
pub async fn events(
    State(api): State<Arc<Api>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let from = resume_from(&headers, query.as_deref())?;
    api.registry.events_from(&id, from).ok_or_else(|| Api::unknown(&id))?;
    let Ok(permit) = api.streams.clone().try_acquire_owned() else {
        let message =
            format!("{} event streams are open (serve.max_event_streams); retry later", api.settings.max_event_streams);
        let mut refused = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::TooManyStreams, message);
        refused.retry_after = Some(api.settings.retry_after_s);
        return Err(refused);
    };
    // The permit lives as long as the stream; the stream at most event_stream_max_s.
    let life = tokio::time::sleep(Duration::from_secs(api.settings.event_stream_max_s));
    let events = stream(api.registry.clone(), id, from).take_until(life).map(move |event| {
        let _held = &permit;
        event
    });
    let mut response =
        Sse::new(events).keep_alive(KeepAlive::new().interval(KEEPALIVE).text("keepalive")).into_response();
    // Proxies that buffer (nginx) would hold the stream back otherwise.
    response.headers_mut().insert("x-accel-buffering", "no".parse().expect("a header value"));
    Ok(response)
}

/// The index of the first event to send: 0, or one past the `Last-Event-ID` the client saw (the
/// header, else `last_event_id` in the query). Either one given must be an event id.
/// The caller's `traceparent` header, as text; a malformed one is ignored where it is read.
fn trace_parent(headers: &HeaderMap) -> Option<&str> {
    headers.get("traceparent").and_then(|value| value.to_str().ok())
}

fn resume_from(headers: &HeaderMap, query: Option<&str>) -> Result<usize, ApiError> {
    let from_query = query.and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("last_event_id=")));
    let from_header = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let (header, query) = (event_id(from_header)?, event_id(from_query)?);
    Ok(header.or(query).map_or(0, |last| last + 1))
}

/// An event id as a client sends it back. Event ids are the document's int32 (no stream comes near
/// 2^31 events), so the `+ 1` after it cannot overflow, and an id out of that range is refused
/// rather than wrapped to 0.
fn event_id(text: Option<&str>) -> Result<Option<usize>, ApiError> {
    let Some(text) = text else { return Ok(None) };
    match text.trim().parse::<i32>() {
        Ok(id) if id >= 0 => Ok(Some(id as usize)),
        _ => Err(ApiError::bad_request(format!("Last-Event-ID must be an event id, 0 to {}", i32::MAX))),
    }
}

/// The events of `id` from `next` on, then each new one as it comes, until the record.
fn stream(registry: Arc<Registry>, id: String, next: usize) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let state = (registry, id, next, Vec::<SseEvent>::new(), false);
    futures::stream::unfold(state, |(registry, id, mut next, mut ready, mut done)| async move {
        loop {
            if !ready.is_empty() {
                let event = ready.remove(0);
                return Some((Ok(event), (registry, id, next, ready, done)));
            }
            if done {
                return None;
            }
            // Forgotten meanwhile (serve.keep_finished): the stream just ends.
            let Events { events, done: finished, mut changed } = registry.events_from(&id, next)?;
            for (index, event) in events {
                ready.push(SseEvent::default().id(index.to_string()).event(&event.name).data(event.data.to_string()));
                next = index + 1;
            }
            done = finished;
            if ready.is_empty() && !done {
                changed.changed().await.ok()?;
            }
        }
    })
}

/// Open questions by stage; in process, each stage's events in flight and the topics' queues.
#[utoipa::path(
    get,
    path = "/v1/stages",
    tag = "operations",
    responses(
        (status = 200, description = "Where the open questions are.", body = Stages),
        NeedsToken,
    )
)]
pub async fn stages(State(api): State<Arc<Api>>) -> Response {
    let by_stage = api.registry.by_stage();
    let in_process = api.transport == Transport::InProcess;
    let stages = api
        .stage_names
        .iter()
        .map(|stage| StageLoad {
            stage,
            questions: by_stage.get(*stage).copied().unwrap_or(0),
            in_flight: in_process.then(|| METRICS.in_flight.with_label_values(&[*stage]).get()),
        })
        .collect();
    let topics = if in_process {
        Topic::ALL
            .iter()
            .map(|t| TopicQueue { topic: t.name(), queued: METRICS.queue_depth.with_label_values(&[t.name()]).get() })
            .filter(|t| t.queued != 0)
            .collect()
    } else {
        Vec::new()
    };
    let pipelines = std::iter::once(&api.default_pipeline)
        .chain(api.buses.keys().filter(|p| **p != api.default_pipeline))
        .cloned()
        .collect();
    let body = Stages {
        transport: if in_process { "in-process" } else { "kafka" },
        pipelines,
        open: api.registry.open(),
        max_open: api.settings.max_open_questions,
        not_started: by_stage.get("").copied().unwrap_or(0),
        stages,
        topics,
        ready: api.ready.load(Ordering::Relaxed),
    };
    json_reply(StatusCode::OK, &body)
}

/// The live page.
#[utoipa::path(get, path = "/", tag = "operations", security(()), responses(
    (status = 200, description = "The live page.", content_type = "text/html", body = String),
))]
pub async fn page() -> Response {
    ([(CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

/// No route here.
pub async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!("no route {}", request.uri().path()))
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
