//! The routes of `lacuna serve` (described for clients in `serve/openapi.json`):
//! - `POST /v1/questions`: one question or a batch; 202 with the ids at once, `Location` the first's;
//! - `GET /v1/questions`: the newest questions and where each stands (the live page's list);
//! - `GET /v1/questions/{id}`: the record when done, else the status and the steps so far;
//! - `GET /v1/questions/{id}/events`: the steps as Server-Sent Events, ending with the record;
//! - `POST /v1/answer`: one question, waiting for its record (202 and its URL past the timeout);
//! - `GET /v1/stages`: open questions by stage, and in process what each stage has in flight;
//! - `/` (the live page), `/openapi.json`, `/metrics`, `/healthz`, `/readyz`, without auth.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, LOCATION};
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::http::{Body, error_reply, json_reply, read_body, reply, sse_event, sse_reply};
use super::registry::{AdmitError, Admitted, Events, NewQuestion, Registry};
use crate::config::ServeSettings;
use crate::metrics::METRICS;
use crate::pipelines::Transport;
use crate::pipelines::input::checked_question;
use crate::topics::{Bus, Event, Topic};

const PAGE: &str = include_str!("page.html");
const OPENAPI: &str = include_str!("openapi.json");

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
}

/// One question as a client sends it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuestionBody {
    #[serde(default)]
    id: Option<String>,
    question: String,
    #[serde(default)]
    pipeline: Option<String>,
    /// The answer must be "yes" or "no".
    #[serde(default)]
    yes_no: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    questions: Vec<QuestionBody>,
    /// The pipeline of questions that name none.
    #[serde(default)]
    pipeline: Option<String>,
}

/// A rejected request: its reply, and the reason it counts under.
struct Refusal(Box<Response<Body>>, &'static str);

impl Refusal {
    fn new(response: Response<Body>, reason: &'static str) -> Self {
        Refusal(Box::new(response), reason)
    }
}

fn bad_request(message: impl std::fmt::Display) -> Refusal {
    Refusal::new(error_reply(StatusCode::BAD_REQUEST, "bad_request", message), "bad_request")
}

/// Ids travel in URLs and Kafka keys: letters, digits and `._:-`, at most 128 of them.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c))
}

fn location(id: &str) -> String {
    format!("/v1/questions/{id}")
}

impl Api {
    /// Answers one request; every reply is counted by route and status.
    pub async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<Body> {
        let origin = request.headers().get("origin").and_then(|o| o.to_str().ok()).map(str::to_string);
        let (route, mut response) = self.route(request).await;
        METRICS.serve_requests.with_label_values(&[route, response.status().as_str()]).inc();
        if let Some(origin) = origin.filter(|o| self.cors_allows(o)) {
            let headers = response.headers_mut();
            if let Ok(value) = HeaderValue::from_str(&origin) {
                headers.insert("access-control-allow-origin", value);
            }
            headers.insert("vary", HeaderValue::from_static("origin"));
            headers.insert("access-control-expose-headers", HeaderValue::from_static("location, retry-after"));
        }
        response
    }

    fn cors_allows(&self, origin: &str) -> bool {
        self.settings.cors_origins.iter().any(|allowed| allowed == "*" || allowed == origin)
    }

    async fn route(&self, request: Request<Incoming>) -> (&'static str, Response<Body>) {
        let path = request.uri().path().to_string();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let method = request.method().clone();
        if method == Method::OPTIONS && segments[0] == "v1" {
            return ("preflight", self.preflight());
        }
        let public = match (&method, segments.as_slice()) {
            (&Method::GET, [""]) => Some(("/", reply(StatusCode::OK, "text/html; charset=utf-8", PAGE))),
            (&Method::GET, ["openapi.json"]) => {
                Some(("/openapi.json", reply(StatusCode::OK, "application/json", OPENAPI)))
            }
            (&Method::GET, ["metrics" | "healthz" | "readyz"]) => {
                crate::pipelines::observe::respond(&path, &self.ready).map(|(status, content_type, body)| {
                    let code = if status.starts_with("200") { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                    let route = match segments[0] {
                        "metrics" => "/metrics",
                        "healthz" => "/healthz",
                        _ => "/readyz",
                    };
                    (route, reply(code, content_type, body))
                })
            }
            _ => None,
        };
        if let Some(public) = public {
            return public;
        }
        if segments[0] != "v1" {
            return ("other", error_reply(StatusCode::NOT_FOUND, "not_found", format!("no route {path}")));
        }
        if let Err(Refusal(response, reason)) = self.authorize(&request) {
            METRICS.serve_rejected.with_label_values(&[reason]).inc();
            return ("unauthorized", *response);
        }
        let outcome = match (&method, &segments[1..]) {
            (&Method::POST, ["questions"]) => ("/v1/questions", self.post_questions(request).await),
            (&Method::GET, ["questions"]) => ("/v1/questions", Ok(self.list())),
            (&Method::GET, ["questions", id]) => ("/v1/questions/{id}", self.get(id)),
            (&Method::GET, ["questions", id, "events"]) => ("/v1/questions/{id}/events", self.events(id, &request)),
            (&Method::POST, ["answer"]) => ("/v1/answer", self.answer(request).await),
            (&Method::GET, ["stages"]) => ("/v1/stages", Ok(self.stages())),
            (_, ["questions"] | ["questions", _] | ["questions", _, "events"] | ["answer"] | ["stages"]) => (
                "other",
                Err(Refusal::new(
                    error_reply(
                        StatusCode::METHOD_NOT_ALLOWED,
                        "method_not_allowed",
                        format!("{method} is not allowed on {path}"),
                    ),
                    "bad_request",
                )),
            ),
            _ => (
                "other",
                Err(Refusal::new(
                    error_reply(StatusCode::NOT_FOUND, "not_found", format!("no route {path}")),
                    "bad_request",
                )),
            ),
        };
        let (route, result) = outcome;
        match result {
            Ok(response) => (route, response),
            Err(Refusal(response, reason)) => {
                METRICS.serve_rejected.with_label_values(&[reason]).inc();
                (route, *response)
            }
        }
    }

    fn preflight(&self) -> Response<Body> {
        let mut response = reply(StatusCode::NO_CONTENT, "text/plain", Bytes::new());
        let headers = response.headers_mut();
        headers.insert("access-control-allow-methods", HeaderValue::from_static("GET, POST, OPTIONS"));
        headers.insert(
            "access-control-allow-headers",
            HeaderValue::from_static("authorization, content-type, idempotency-key, last-event-id"),
        );
        headers.insert("access-control-max-age", HeaderValue::from_static("600"));
        response
    }

    /// With a token configured, /v1 needs `Authorization: Bearer <token>`. The digests are compared
    /// in constant time, so neither the token's bytes nor its length leak through timing.
    fn authorize(&self, request: &Request<Incoming>) -> Result<(), Refusal> {
        let Some(token) = &self.token else { return Ok(()) };
        let given = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        let (given, wanted) = (Sha256::digest(given.as_bytes()), Sha256::digest(token.as_bytes()));
        if bool::from(given.ct_eq(&wanted)) {
            return Ok(());
        }
        let mut response =
            error_reply(StatusCode::UNAUTHORIZED, "unauthorized", "this API needs Authorization: Bearer <token>");
        response.headers_mut().insert("www-authenticate", HeaderValue::from_static("Bearer"));
        Err(Refusal::new(response, "unauthorized"))
    }

    /// Reads a JSON body into questions, checked: 400 with the first problem otherwise.
    async fn read_questions(
        &self,
        request: Request<Incoming>,
        extra: &[&str],
    ) -> Result<(Vec<NewQuestion>, Value), Refusal> {
        let key = request.headers().get("idempotency-key").map(|v| v.to_str().map(str::to_string));
        let key = match key {
            Some(Ok(key)) if !key.is_empty() && key.len() <= 200 => Some(key),
            Some(_) => return Err(bad_request("Idempotency-Key must be 1 to 200 visible ASCII characters")),
            None => None,
        };
        let body = read_body(request, self.settings.max_body_bytes).await.map_err(|r| Refusal::new(r, "too_large"))?;
        let mut value: Value =
            serde_json::from_slice(&body).map_err(|e| bad_request(format!("the body is not JSON: {e}")))?;
        // Options of the route itself (`timeout_ms`), taken out before the question is read.
        let mut options = json!({});
        if let Some(object) = value.as_object_mut() {
            for name in extra {
                if let Some(option) = object.remove(*name) {
                    options[*name] = option;
                }
            }
        }
        let (bodies, default_pipeline, batch) = if value.get("questions").is_some() {
            let batch: BatchBody = serde_json::from_value(value).map_err(|e| bad_request(format!("a batch: {e}")))?;
            (batch.questions, batch.pipeline, true)
        } else {
            let one: QuestionBody = serde_json::from_value(value).map_err(|e| {
                bad_request(format!("expected {{\"question\": \"...\"}} or {{\"questions\": [...]}}: {e}"))
            })?;
            (vec![one], None, false)
        };
        if bodies.is_empty() || bodies.len() > self.settings.max_batch {
            return Err(bad_request(format!(
                "a request holds 1 to {} questions (serve.max_batch)",
                self.settings.max_batch
            )));
        }
        let mut questions = Vec::new();
        for (i, body) in bodies.into_iter().enumerate() {
            let at = if batch { format!("questions[{i}]: ") } else { String::new() };
            let question = checked_question(&body.question, self.max_question_chars)
                .map_err(|message| bad_request(format!("{at}{message}")))?;
            if let Some(id) = &body.id
                && !valid_id(id)
            {
                return Err(bad_request(format!("{at}id {id:?}: use 1 to 128 letters, digits or ._:-")));
            }
            let pipeline = body.pipeline.or(default_pipeline.clone()).unwrap_or_else(|| self.default_pipeline.clone());
            if !self.buses.contains_key(&pipeline) {
                let served: Vec<&String> = self.buses.keys().collect();
                return Err(bad_request(format!("{at}pipeline {pipeline:?} is not served here (served: {served:?})")));
            }
            let key = key.as_ref().map(|k| if batch { format!("{k}#{i}") } else { k.clone() });
            questions.push(NewQuestion { id: body.id, key, question, pipeline, yes_no: body.yes_no });
        }
        if questions.iter().filter_map(|q| q.id.as_ref()).collect::<std::collections::HashSet<_>>().len()
            < questions.iter().filter(|q| q.id.is_some()).count()
        {
            return Err(bad_request("two questions of the batch have the same id"));
        }
        Ok((questions, options))
    }

    /// Admits the questions and publishes the new ones; each id with whether it was new. A question
    /// counts as accepted only once the bus took it (over Kafka: the broker acknowledged it).
    async fn submit(&self, questions: Vec<NewQuestion>) -> Result<Vec<(String, bool)>, Refusal> {
        let pipelines: Vec<String> = questions.iter().map(|q| q.pipeline.clone()).collect();
        let admitted = self.registry.admit(questions).map_err(|error| match error {
            AdmitError::TooManyOpen { .. } => {
                let mut response = error_reply(StatusCode::TOO_MANY_REQUESTS, "too_many_open", &error);
                let retry = HeaderValue::from_str(&self.settings.retry_after_s.to_string()).expect("digits");
                response.headers_mut().insert("retry-after", retry);
                Refusal::new(response, "too_many_open")
            }
            AdmitError::Conflict(_) => {
                Refusal::new(error_reply(StatusCode::CONFLICT, "conflict", &error), "bad_request")
            }
        })?;
        let mut ids = Vec::new();
        let mut unpublished: Vec<String> = admitted
            .iter()
            .filter_map(|a| match a {
                Admitted::New(q) => Some(q.id.clone()),
                Admitted::Existing(_) => None,
            })
            .collect();
        for (admitted, pipeline) in admitted.into_iter().zip(pipelines) {
            match admitted {
                Admitted::Existing(id) => ids.push((id, false)),
                Admitted::New(question) => {
                    let id = question.id.clone();
                    if let Err(error) = self.buses[&pipeline].publish(question.to_record()).await {
                        for id in &unpublished {
                            self.registry.withdraw(id);
                        }
                        // Those published before the failure were accepted: say which.
                        let accepted: Vec<&String> = ids.iter().filter(|(_, new)| *new).map(|(id, _)| id).collect();
                        let message = format!("the bus did not take question {id}: {error}");
                        let body = json!({"error": {"code": "unavailable", "message": message}, "accepted": accepted});
                        let response = json_reply(StatusCode::SERVICE_UNAVAILABLE, &body);
                        return Err(Refusal::new(response, "unavailable"));
                    }
                    unpublished.retain(|u| *u != id);
                    ids.push((id, true));
                }
            }
        }
        Ok(ids)
    }

    async fn post_questions(&self, request: Request<Incoming>) -> Result<Response<Body>, Refusal> {
        let (questions, _) = self.read_questions(request, &[]).await?;
        let ids = self.submit(questions).await?;
        let listed: Vec<Value> =
            ids.iter().map(|(id, new)| json!({"id": id, "location": location(id), "duplicate": !new})).collect();
        let mut body = json!({"questions": listed});
        if ids.len() == 1 {
            body["id"] = json!(ids[0].0);
            body["location"] = json!(location(&ids[0].0));
        }
        let mut response = json_reply(StatusCode::ACCEPTED, &body);
        response.headers_mut().insert(LOCATION, HeaderValue::from_str(&location(&ids[0].0)).expect("ids are URL-safe"));
        Ok(response)
    }

    async fn answer(&self, request: Request<Incoming>) -> Result<Response<Body>, Refusal> {
        let (questions, options) = self.read_questions(request, &["timeout_ms"]).await?;
        if questions.len() != 1 {
            return Err(bad_request("POST /v1/answer takes one question; POST /v1/questions takes batches"));
        }
        let timeout = match &options["timeout_ms"] {
            Value::Null => self.settings.answer_timeout_ms,
            value => value.as_u64().ok_or_else(|| bad_request("timeout_ms must be a whole number"))?,
        };
        let ids = self.submit(questions).await?;
        let id = &ids[0].0;
        if let Some(record) = self.registry.wait_record(id, Duration::from_millis(timeout)).await {
            return Ok(json_reply(StatusCode::OK, &record));
        }
        let mut response = json_reply(
            StatusCode::ACCEPTED,
            &json!({"id": id, "location": location(id), "status": "running", "message": format!("no record within {timeout} ms: GET the location")}),
        );
        response.headers_mut().insert(LOCATION, HeaderValue::from_str(&location(id)).expect("ids are URL-safe"));
        Ok(response)
    }

    fn list(&self) -> Response<Body> {
        json_reply(StatusCode::OK, &json!({"open": self.registry.open(), "questions": self.registry.list(200)}))
    }

    fn unknown(id: &str) -> Refusal {
        Refusal::new(
            error_reply(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no question {id} here (never asked, or forgotten: serve.keep_finished)"),
            ),
            "bad_request",
        )
    }

    fn get(&self, id: &str) -> Result<Response<Body>, Refusal> {
        let body = self.registry.get(id).ok_or_else(|| Self::unknown(id))?;
        Ok(json_reply(StatusCode::OK, &body))
    }

    /// The question's events from after `Last-Event-ID` (header, or `last_event_id` in the query for
    /// clients that cannot set headers), then each new one as it comes, ending with the record.
    fn events(&self, id: &str, request: &Request<Incoming>) -> Result<Response<Body>, Refusal> {
        let query_last = request
            .uri()
            .query()
            .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("last_event_id=")).map(str::to_string));
        let last =
            request.headers().get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_string).or(query_last);
        let from = match last {
            Some(last) => {
                last.trim().parse::<usize>().map_err(|_| bad_request("Last-Event-ID must be an event id"))? + 1
            }
            None => 0,
        };
        self.registry.events_from(id, from).ok_or_else(|| Self::unknown(id))?;
        let state = (self.registry.clone(), id.to_string(), from, false);
        let stream = futures::stream::unfold(state, |(registry, id, mut next, ended)| async move {
            if ended {
                return None;
            }
            loop {
                // Forgotten meanwhile (serve.keep_finished): the stream just ends.
                let Events { events, done, mut changed } = registry.events_from(&id, next)?;
                if !events.is_empty() {
                    let mut chunk = Vec::new();
                    for (index, event) in events {
                        chunk.extend_from_slice(&sse_event(index, &event.name, &event.data));
                        next = index + 1;
                    }
                    return Some((Bytes::from(chunk), (registry, id, next, done)));
                }
                if done {
                    return None;
                }
                match tokio::time::timeout(KEEPALIVE, changed.changed()).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(_)) => return None,
                    Err(_) => return Some((Bytes::from_static(b": keepalive\n\n"), (registry, id, next, false))),
                }
            }
        });
        Ok(sse_reply(stream))
    }

    /// Where the open questions are: by the stage of their latest step, and in process, each
    /// stage's events in flight and each topic's queue.
    fn stages(&self) -> Response<Body> {
        let by_stage = self.registry.by_stage();
        let in_process = self.transport == Transport::InProcess;
        let stages: Vec<Value> = self
            .stage_names
            .iter()
            .map(|stage| {
                let in_flight = in_process.then(|| METRICS.in_flight.with_label_values(&[*stage]).get());
                json!({"stage": stage, "questions": by_stage.get(*stage).copied().unwrap_or(0), "in_flight": in_flight})
            })
            .collect();
        let topics: Vec<Value> = if in_process {
            Topic::ALL
                .iter()
                .map(|t| json!({"topic": t.name(), "queued": METRICS.queue_depth.with_label_values(&[t.name()]).get()}))
                .filter(|t| t["queued"] != 0)
                .collect()
        } else {
            Vec::new()
        };
        json_reply(
            StatusCode::OK,
            &json!({
                "transport": if in_process { "in-process" } else { "kafka" },
                "pipelines": std::iter::once(&self.default_pipeline)
                    .chain(self.buses.keys().filter(|p| **p != self.default_pipeline))
                    .collect::<Vec<_>>(),
                "open": self.registry.open(),
                "max_open": self.settings.max_open_questions,
                "not_started": by_stage.get("").copied().unwrap_or(0),
                "stages": stages,
                "topics": topics,
                "ready": self.ready.load(Ordering::Relaxed),
            }),
        )
    }
}
