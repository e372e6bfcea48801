//! Client for any OpenAI-compatible `/v1/chat/completions` endpoint (llama.cpp server, vLLM, Ollama,
//! OpenAI). Structured calls send a JSON schema as `response_format`; servers that ignore it still work
//! through a tolerant parser. Each stage owns a client with its own concurrency limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::attempt_spend;
use super::breaker::Breaker;
use super::call_stats::CallStats;
use super::llm_cache::{CachedResponse, ResponseCache};
use super::schema::Schema;
use super::value_logprobs::value_logprobs;
use crate::config::{CacheMode, LlmSettings};
use crate::telemetry::genai::{LlmOutcome, LlmSpan};
use crate::topics::AnswerLogprobs;

#[derive(Debug, thiserror::Error, Clone)]
pub enum LlmError {
    #[error("LLM endpoint {url} unreachable: {message}")]
    Unreachable { url: String, message: String },
    #[error("LLM call timed out after {0} ms")]
    Timeout(u64),
    #[error("LLM endpoint answered HTTP {status}: {body}")]
    Status {
        status: u16,
        body: String,
        /// The server's `Retry-After` (429, 503), in milliseconds.
        retry_after_ms: Option<u64>,
    },
    #[error("LLM answer unusable: {0}")]
    BadResponse(String),
    #[error("llm.cache_mode = \"replay\" and the response cache has no entry {0} for this call")]
    NotCached(String),
}

impl LlmError {
    /// The metric label / error record type of this error.
    pub fn error_type(&self) -> &'static str {
        match self {
            LlmError::Unreachable { .. } => "llm_unreachable",
            LlmError::Timeout(_) => "llm_timeout",
            LlmError::Status { .. } => "llm_http_status",
            LlmError::BadResponse(_) => "llm_bad_response",
            LlmError::NotCached(_) => "llm_cache_miss",
        }
    }

    /// Worth another attempt: the server may be back, less busy or less flaky next time.
    pub fn is_transient(&self) -> bool {
        match self {
            LlmError::Unreachable { .. } | LlmError::Timeout(_) => true,
            LlmError::Status { status, .. } => *status == 429 || *status >= 500,
            LlmError::BadResponse(_) | LlmError::NotCached(_) => false,
        }
    }

    /// How long the server asked us to stay away.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::Status { retry_after_ms, .. } => retry_after_ms.map(Duration::from_millis),
            _ => None,
        }
    }
}

/// Why a reply that came back cannot be used: the re-ask's cause.
enum Unusable {
    /// Stopped at `max_tokens` before the structure closed.
    Cut,
    Unparsable(LlmError),
}

impl Unusable {
    /// The `cause` label of `lacuna_llm_reasks_total`.
    fn cause(&self) -> &'static str {
        match self {
            Unusable::Cut => "cut_at_max_tokens",
            Unusable::Unparsable(_) => "unparsable",
        }
    }

    /// The request of the next ask: more room after a cut, else another sample (a new `seed`, and
    /// a little temperature when decoding is greedy, or a deterministic server repeats itself).
    fn change(&self, body: &mut Value, reask: u32, settings: &LlmSettings) {
        match self {
            Unusable::Cut => {
                let max_tokens = body["max_tokens"].as_u64().unwrap_or(u64::from(settings.max_tokens));
                body["max_tokens"] = json!(max_tokens.saturating_mul(2));
            }
            Unusable::Unparsable(_) => {
                // Another seed than the call's own sample seed (self-consistency sends several).
                body["seed"] = json!(body["seed"].as_u64().unwrap_or(0) * 100 + u64::from(reask));
                let temperature = body["temperature"].as_f64().unwrap_or(0.0);
                body["temperature"] = json!(temperature.max(f64::from(settings.reask_temperature)));
            }
        }
    }

    fn into_error(self, body: &Value) -> LlmError {
        match self {
            Unusable::Cut => LlmError::BadResponse(format!("answer cut off at max_tokens = {}", body["max_tokens"])),
            Unusable::Unparsable(error) => error,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Completion<T> {
    pub value: T,
    pub stats: CallStats,
}

/// The schema with every object's keys sorted, as serde_json without `preserve_order` sent them:
/// a grammar-constrained server then makes the model write the keys in that order, so "answer"
/// comes before "explanation" (`llm.reasoning_first = false`, kept for the ablation).
fn alphabetical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k.clone(), alphabetical(v))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(alphabetical).collect()),
        other => other.clone(),
    }
}

#[derive(Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    settings: Arc<LlmSettings>,
    api_key: Option<String>,
    limit: Arc<Semaphore>,
    /// The `stage` label of this client's metrics.
    stage: Arc<str>,
    cache: Option<ResponseCache>,
    /// Shared with every client of the process that calls the same endpoint.
    breaker: Arc<Breaker>,
    /// A temperature and seed of this client's own (one sample of several), instead of `temperature`.
    sampling: Option<(f32, u64)>,
}

impl LlmClient {
    pub fn new(settings: LlmSettings) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(settings.timeout_ms))
            .build()
            .expect("a reqwest client with a timeout builds");
        // The key never goes into the config file or the logs: only its variable's name does.
        let api_key = std::env::var(&settings.api_key_env).ok().filter(|key| !key.is_empty());
        let limit = Arc::new(Semaphore::new(settings.max_concurrency.max(1)));
        let cache = settings.cache.then(|| ResponseCache::new(&settings.cache_dir));
        let breaker = Breaker::for_llm(&settings);
        LlmClient {
            http,
            settings: Arc::new(settings),
            api_key,
            limit,
            stage: Arc::from("none"),
            cache,
            breaker,
            sampling: None,
        }
    }

    /// The same client, its metrics labelled with `stage`.
    pub fn for_stage(self, stage: &str) -> Self {
        LlmClient { stage: Arc::from(stage), ..self }
    }

    /// The same client, drawing one sample at `temperature` with its own `seed`: N samples of one
    /// prompt are N requests, each cached under its own seed (a cache keyed on the prompt alone would
    /// turn them into one).
    pub fn sampling(&self, temperature: f32, seed: u64) -> Self {
        LlmClient { sampling: Some((temperature, seed)), ..self.clone() }
    }

    pub fn settings(&self) -> &LlmSettings {
        &self.settings
    }

    /// A call whose answer must follow `schema`, parsed into `T`.
    pub async fn structured<T: DeserializeOwned>(
        &self,
        system: &str,
        user: &str,
        schema: &Schema,
    ) -> Result<Completion<T>, LlmError> {
        self.structured_scored(system, user, schema, false).await
    }

    /// [`LlmClient::structured`], asking for token log-probabilities too when `logprobs`. A reply
    /// that does not parse, or was cut off at `max_tokens`, is asked again (`llm.max_reask`).
    pub async fn structured_scored<T: DeserializeOwned>(
        &self,
        system: &str,
        user: &str,
        schema: &Schema,
        logprobs: bool,
    ) -> Result<Completion<T>, LlmError> {
        let schema_value =
            if self.settings.reasoning_first { schema.schema.clone() } else { alphabetical(&schema.schema) };
        let response_format = json!({
            "type": "json_schema",
            "json_schema": { "name": schema.name, "strict": true, "schema": schema_value },
        });
        let body = self.body(system, user, Some(response_format), logprobs);
        self.complete(body, |text, cut| {
            if cut {
                return Err(Unusable::Cut);
            }
            parse_lenient(text).map_err(Unusable::Unparsable)
        })
        .await
    }

    /// A free-text call. A reply cut off at `max_tokens` is kept as cut (`stats.truncated`): a
    /// shortened text is still text, and the stage decides what it is worth.
    pub async fn text(&self, system: &str, user: &str) -> Result<Completion<String>, LlmError> {
        self.complete(self.body(system, user, None, false), |text, _| Ok(text.to_string())).await
    }

    /// A one-line free-text call that also asks for the token log-probabilities (OpenAI's
    /// `logprobs`): `stats.logprobs` is `None` when the server does not return them. Generation
    /// stops at the end of the line, so the log-probabilities are the answer's own (RQ-RAG's Conf),
    /// not those of whatever the model would write after it.
    pub async fn line_with_logprobs(&self, system: &str, user: &str) -> Result<Completion<String>, LlmError> {
        let mut body = self.body(system, user, None, true);
        body["stop"] = json!(["\n"]);
        self.complete(body, |text, _| Ok(text.to_string())).await
    }

    fn body(&self, system: &str, user: &str, response_format: Option<Value>, logprobs: bool) -> Value {
        let mut messages = Vec::new();
        if !system.is_empty() {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": user}));
        let mut body = json!({
            "model": self.settings.model,
            "messages": messages,
            "temperature": self.settings.temperature,
            "max_tokens": self.settings.max_tokens,
        });
        if let Some(format) = response_format {
            body["response_format"] = format;
        }
        if logprobs {
            body["logprobs"] = json!(true);
        }
        if let Some((temperature, seed)) = self.sampling {
            body["temperature"] = json!(temperature);
            body["seed"] = json!(seed);
        }
        body
    }

    /// Sends `body` until `accept` takes a reply: transient failures are retried (`max_retries`),
    /// unusable replies asked again (`max_reask`), each time with a changed request, since asking
    /// the same thing of a deterministic server gets the same reply. The cache keeps, under the
    /// call's original request, only a reply `accept` took: a broken one is never read back.
    async fn complete<T>(
        &self,
        mut body: Value,
        accept: impl Fn(&str, bool) -> Result<T, Unusable>,
    ) -> Result<Completion<T>, LlmError> {
        let (m, stage) = (&crate::metrics::METRICS, &[&*self.stage]);
        let prompt = crate::telemetry::genai::record_content().then(|| body["messages"].to_string());
        let span = LlmSpan::start(&self.settings.model, &self.settings.base_url, &self.stage, prompt);
        let cache = self.cache.as_ref().map(|cache| (cache, ResponseCache::key(&self.settings.base_url, &body)));
        let hit = cache.as_ref().and_then(|(cache, key)| cache.get(key));
        if let Some(hit) = &hit
            && hit.failed.is_none()
            && let Ok(value) = accept(&hit.text, hit.truncated)
        {
            m.llm_cache_hits.with_label_values(stage).inc();
            let stats = CallStats {
                prompt_tokens: hit.prompt_tokens,
                completion_tokens: hit.completion_tokens,
                cached_tokens: hit.cached_tokens,
                logprobs: hit.logprobs.clone(),
                answer_logprobs: hit.answer_logprobs.clone(),
                truncated: hit.truncated,
                cache_hit: true,
                ..CallStats::default()
            };
            attempt_spend::charge(&stats);
            span.end(self.outcome(&stats, crate::telemetry::genai::record_content().then_some(&*hit.text)));
            return Ok(Completion { value, stats });
        }
        if let Some((_, key)) = &cache
            && self.settings.cache_mode == CacheMode::Replay
        {
            // The recorded call failed after its re-asks: so does its replay, at the same cost.
            let (error, tokens) = match hit {
                Some(CachedResponse {
                    failed: Some(message), prompt_tokens, completion_tokens, cached_tokens, ..
                }) => {
                    let spent = CallStats {
                        prompt_tokens,
                        completion_tokens,
                        cached_tokens,
                        cache_hit: true,
                        ..CallStats::default()
                    };
                    attempt_spend::charge(&spent);
                    (LlmError::BadResponse(message), (prompt_tokens, completion_tokens))
                }
                _ => (LlmError::NotCached(key.clone()), (0, 0)),
            };
            m.llm_errors.with_label_values(&[&*self.stage, error.error_type()]).inc();
            span.fail(error.error_type(), error.to_string(), self.breaker.state_name(), tokens);
            return Err(error);
        }

        let _permit = self.limit.acquire().await.expect("the semaphore is never closed");
        let _in_flight = InFlight::new(m.llm_in_flight.with_label_values(stage));
        let started = Instant::now();
        let mut spent = CallStats::default();
        let mut reasks = 0;
        let outcome = loop {
            let (text, stats) = match self.attempts(&body, started).await {
                Ok(reply) => reply,
                Err(error) => break Err(error),
            };
            spent.add(&stats);
            let unusable = match accept(&text, stats.truncated) {
                Ok(value) => break Ok((text, value, stats)),
                Err(unusable) => unusable,
            };
            m.llm_reasks.with_label_values(&[&*self.stage, unusable.cause()]).inc();
            if reasks >= self.settings.max_reask {
                break Err(unusable.into_error(&body));
            }
            reasks += 1;
            tracing::warn!(
                stage = &*self.stage,
                reask = reasks,
                cause = unusable.cause(),
                "unusable LLM reply, asking again"
            );
            unusable.change(&mut body, reasks, &self.settings);
        };
        match outcome {
            Ok((text, value, stats)) => {
                // Kept for the span only where it records the completion; the cache takes the text.
                let completion = crate::telemetry::genai::record_content().then(|| text.clone());
                if let Some((cache, key)) = &cache {
                    let entry = CachedResponse {
                        text,
                        logprobs: stats.logprobs.clone(),
                        answer_logprobs: stats.answer_logprobs.clone(),
                        truncated: stats.truncated,
                        ..CachedResponse::spent(&spent)
                    };
                    keep(cache, key, &entry);
                }
                m.llm_calls.with_label_values(stage).inc();
                m.llm_request_seconds.with_label_values(stage).observe(started.elapsed().as_secs_f64());
                m.llm_prompt_tokens.with_label_values(stage).inc_by(spent.prompt_tokens);
                m.llm_completion_tokens.with_label_values(stage).inc_by(spent.completion_tokens);
                m.llm_cached_tokens.with_label_values(stage).inc_by(spent.cached_tokens);
                let stats = CallStats {
                    latency_ms: started.elapsed().as_millis() as u64,
                    cost: self.settings.prices.get(&self.settings.model).map_or(0.0, |price| spent.cost_at(price)),
                    reasks,
                    logprobs: stats.logprobs,
                    answer_logprobs: stats.answer_logprobs,
                    truncated: stats.truncated,
                    ..spent
                };
                attempt_spend::charge(&stats);
                span.end(self.outcome(&stats, completion.as_deref()));
                Ok(Completion { value, stats })
            }
            Err(error) => {
                if let (Some((cache, key)), LlmError::BadResponse(message)) = (&cache, &error) {
                    keep(
                        cache,
                        key,
                        &CachedResponse { failed: Some(message.clone()), ..CachedResponse::spent(&spent) },
                    );
                }
                m.llm_errors.with_label_values(&[&*self.stage, error.error_type()]).inc();
                // A call the endpoint answered, or timed out on, was spent even though it failed.
                let charged = !matches!(error, LlmError::Unreachable { .. });
                if charged {
                    attempt_spend::charge(&spent);
                }
                let tokens = if charged { (spent.prompt_tokens, spent.completion_tokens) } else { (0, 0) };
                span.fail(error.error_type(), error.to_string(), self.breaker.state_name(), tokens);
                Err(error)
            }
        }
    }

    /// What a call came to, for its span: the tokens it charged to the question, and the
    /// `completion` where the span records it.
    fn outcome<'a>(&'a self, stats: &CallStats, completion: Option<&'a str>) -> LlmOutcome<'a> {
        LlmOutcome {
            input_tokens: stats.prompt_tokens,
            output_tokens: stats.completion_tokens,
            cached_tokens: stats.cached_tokens,
            finish_reason: if stats.truncated { "length" } else { "stop" },
            reasks: stats.reasks,
            attempts: stats.attempts,
            cache_hit: stats.cache_hit,
            breaker: self.breaker.state_name(),
            completion,
        }
    }

    /// Sends `body` until the endpoint answers. Transient failures are retried `max_retries` times
    /// with jittered backoff, never sooner than the server's `Retry-After` (up to
    /// `llm.breaker.max_probe_ms`); failures while the
    /// endpoint's circuit is open spend no retry, the call waits for the circuit instead.
    async fn attempts(&self, body: &Value, started: Instant) -> Result<(String, CallStats), LlmError> {
        let (mut attempt, mut sent) = (0, 0);
        // One call waits for the circuit at most llm.breaker.max_wait_ms in all, however many probes
        // it makes meanwhile.
        let give_up_at = self.breaker.deadline();
        loop {
            if let Err(open) = self.breaker.pass(give_up_at).await {
                return Err(LlmError::Unreachable {
                    url: self.settings.base_url.clone(),
                    message: format!(
                        "circuit open for {} s; this call waited llm.breaker.max_wait_ms",
                        open.0.as_secs()
                    ),
                });
            }
            attempt += 1;
            sent += 1;
            let error = match self.send_once(body).await {
                Ok((text, mut stats)) => {
                    self.breaker.succeeded();
                    stats.latency_ms = started.elapsed().as_millis() as u64;
                    stats.attempts = sent;
                    return Ok((text, stats));
                }
                Err(error) if !error.is_transient() => {
                    // The endpoint answered: it is up, whatever it thought of this request.
                    self.breaker.succeeded();
                    return Err(error);
                }
                Err(error) => error,
            };
            if self.breaker.failed(error.retry_after()) {
                tracing::warn!(stage = &*self.stage, %error, "LLM call failed with the endpoint's circuit open: waiting for it");
                attempt -= 1;
                continue;
            }
            if attempt > self.settings.max_retries {
                return Err(error);
            }
            let backoff = crate::actors::clients::backoff(self.settings.retry_backoff_ms, attempt)
                .max(self.breaker.capped(error.retry_after()));
            tracing::warn!(attempt, backoff_ms = backoff.as_millis() as u64, %error, "LLM call failed, retrying");
            tokio::time::sleep(backoff).await;
        }
    }

    async fn send_once(&self, body: &Value) -> Result<(String, CallStats), LlmError> {
        let url = format!("{}/chat/completions", self.settings.base_url.trim_end_matches('/'));
        let mut request = self.http.post(&url).json(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| self.transport_error(&url, e))?;
        let status = response.status();
        if !status.is_success() {
            let retry_after_ms = retry_after_ms(response.headers());
            let body = response.text().await.unwrap_or_default();
            return Err(LlmError::Status { status: status.as_u16(), body: truncate(&body, 300), retry_after_ms });
        }
        let payload: Value = response.json().await.map_err(|e| self.transport_error(&url, e))?;
        let text = payload["choices"][0]["message"]["content"]
            .as_str()
            .ok_or_else(|| {
                LlmError::BadResponse(format!(
                    "no choices[0].message.content in {}",
                    truncate(&payload.to_string(), 300)
                ))
            })?
            .to_string();
        let usage = &payload["usage"];
        let stats = CallStats {
            prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
            completion_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
            cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
            logprobs: token_logprobs(&payload["choices"][0]["logprobs"]),
            answer_logprobs: value_logprobs(&payload["choices"][0]["logprobs"], "answer"),
            truncated: payload["choices"][0]["finish_reason"] == "length",
            ..CallStats::default()
        };
        Ok((text, stats))
    }

    fn transport_error(&self, url: &str, error: reqwest::Error) -> LlmError {
        if error.is_timeout() {
            LlmError::Timeout(self.settings.timeout_ms)
        } else if error.is_decode() {
            LlmError::BadResponse(error.to_string())
        } else {
            LlmError::Unreachable { url: url.to_string(), message: error.to_string() }
        }
    }
}

/// A `Retry-After` header in seconds (its HTTP-date form is rare from LLM servers and is ignored).
fn retry_after_ms(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    let seconds: f64 = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then_some((seconds * 1000.0) as u64)
}

/// The sum and count of `logprobs.content[].logprob`, the OpenAI chat format llama.cpp also uses.
fn token_logprobs(logprobs: &Value) -> Option<AnswerLogprobs> {
    let tokens = logprobs["content"].as_array()?;
    let values: Vec<f64> = tokens.iter().filter_map(|t| t["logprob"].as_f64()).collect();
    (!values.is_empty()).then(|| AnswerLogprobs { sum: values.iter().sum(), tokens: values.len() as u32 })
}

/// Parses a JSON answer, tolerating what servers without schema support produce: code fences and
/// prose around the object.
pub fn parse_lenient<T: DeserializeOwned>(text: &str) -> Result<T, LlmError> {
    let direct = serde_json::from_str::<T>(text.trim());
    let first_error = match direct {
        Ok(value) => return Ok(value),
        Err(e) => e,
    };
    let (start, end) = (text.find('{'), text.rfind('}'));
    if let (Some(start), Some(end)) = (start, end)
        && start < end
        && let Ok(value) = serde_json::from_str::<T>(&text[start..=end])
    {
        return Ok(value);
    }
    Err(LlmError::BadResponse(format!("{first_error} in {:?}", truncate(text, 200))))
}

fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

/// LLM calls holding a slot now, across every client of the process (`lacuna bench` samples it).
static CALLS_IN_FLIGHT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

pub fn calls_in_flight() -> i64 {
    CALLS_IN_FLIGHT.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts a call in `lacuna_llm_in_flight` while it lives, however the call ends.
struct InFlight(prometheus::IntGauge);

impl InFlight {
    fn new(gauge: prometheus::IntGauge) -> Self {
        gauge.inc();
        CALLS_IN_FLIGHT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        InFlight(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
        CALLS_IN_FLIGHT.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Stores a call's outcome. A cache that cannot be written costs a repeat call later, not this answer.
fn keep(cache: &ResponseCache, key: &str, entry: &CachedResponse) {
    if let Err(error) = cache.put(key, entry) {
        tracing::warn!(%error, dir = %cache.dir().display(), "cannot write the LLM response cache");
    }
}
