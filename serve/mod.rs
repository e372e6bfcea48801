//! `lacuna serve`: questions in over HTTP, answers and their trace out, live (docs/serve.md).
//!
//! In process it runs the pipelines' stages itself, on the in-process bus: an accepted question is
//! held in memory and a restart loses it. Over Kafka it publishes to each pipeline's questions topic
//! (202 only once the broker acknowledged the question) and reads the answers and progress topics,
//! every partition, in consumer groups of its own: any replica can answer for any question.
//!
//! - `api`: the routes, each a typed handler carrying its part of the OpenAPI document (`api_tests`:
//!   its tests with a bus slow to take a question).
//! - `bodies`: what a client sends and gets back, each a type its OpenAPI schema is derived from.
//! - `documents`: the live corpus's routes (add, read, delete a document), behind a token of their own.
//! - `http`: JSON replies and errors, bodies under size and time limits, the layers every route shares.
//! - `openapi`: the router and its OpenAPI document, both built from the handlers (`openapi.json` is
//!   the committed copy); `page.html` is the live page.
//! - `registry`: each question's state, its numbered event stream (for SSE resumes) and its record.
//! - `entry`: one question as the registry holds it: its events, the steps seen per node, its record.
//! - `observe`: the process's own HTTP listener: /metrics, /healthz, /readyz, and the connection limits
//!   serve shares.

pub mod api;
pub mod bodies;
pub mod documents;
mod entry;
pub mod http;
pub mod observe;
pub mod openapi;
pub mod registry;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

use crate::actors::clients::MeiliSearch;
use crate::config::{SearchBackend, Settings};
use crate::pipelines::parts::Parts;
use crate::pipelines::{Pipeline, PipelineKind, Transport};
use crate::topics::kafka::KafkaBus;
use crate::topics::{Bus, Event, ProgressEvent, Subscription, Topic, VersionedAnswer};
use api::Api;
use documents::{DocumentRoutes, Target};
use registry::Registry;

pub struct ServeOptions {
    pub transport: Transport,
    /// The pipelines served; the first is the default for questions that name none.
    pub pipelines: Vec<PipelineKind>,
    pub listen: String,
}

/// A running server.
pub struct Server {
    pub address: SocketAddr,
    pub registry: Arc<Registry>,
    failure: watch::Receiver<Option<String>>,
    /// Stops the in-process pipelines.
    stop: watch::Sender<bool>,
}

impl Server {
    /// Resolves with the reason once a feed or a pipeline failed: no more answers can come.
    pub async fn failed(&mut self) -> String {
        match self.failure.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops the in-process pipelines: questions still open are lost (they were held in memory).
    pub fn stop(self) {
        self.stop.send_replace(true);
    }
}

/// The bearer token named by `name` (`serve.token_env`, `serve.documents_token_env`): none when
/// unnamed, an error when named but unset.
fn token(name: &str) -> anyhow::Result<Option<String>> {
    if name.is_empty() {
        return Ok(None);
    }
    match std::env::var(name) {
        Ok(token) if !token.is_empty() => Ok(Some(token)),
        _ => anyhow::bail!(
            "the token's variable {name} is not set (serve.token_env, serve.documents_token_env): set it, or empty the setting"
        ),
    }
}

/// This replica's name in its consumer groups.
fn replica_id(settings: &Settings) -> String {
    if !settings.serve.replica_id.is_empty() {
        return settings.serve.replica_id.clone();
    }
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "serve".to_string())
}

/// Starts the pipelines (in process) or connects to their topics (Kafka), then the HTTP server.
/// `parts` loads what a pipeline's stages need; it is called in process only.
pub async fn start(
    settings: &Settings,
    options: ServeOptions,
    mut parts: impl FnMut(PipelineKind) -> anyhow::Result<Parts>,
) -> anyhow::Result<Server> {
    anyhow::ensure!(!options.pipelines.is_empty(), "serve at least one pipeline");
    let documents_token = token(&settings.serve.documents_token_env)?;
    let token = token(&settings.serve.token_env)?;
    let mut settings = settings.clone();
    if options.transport == Transport::InProcess {
        // Stages here must publish progress; the open bound is also the bound the queues are sized for.
        settings.bus.progress = true;
        settings.run.max_open_questions = settings.serve.max_open_questions;
    }
    let serve = &settings.serve;
    let registry = Arc::new(Registry::new(serve.max_open_questions, serve.keep_finished, serve.registry_max_bytes));
    let (fail, failure) = watch::channel(None::<String>);
    let fail = Arc::new(fail);
    let mut buses: BTreeMap<String, Arc<dyn Bus>> = BTreeMap::new();
    let (stop, stopped) = watch::channel(false);
    let replica = replica_id(&settings);
    // Over Kafka, one watch per feed that turns true once it has read its replay window.
    let mut catching_up: Vec<watch::Receiver<bool>> = Vec::new();
    for kind in &options.pipelines {
        let name = kind.name().to_string();
        let (bus, progress): (Arc<dyn Bus>, _) = match options.transport {
            Transport::InProcess => {
                let mut pipeline = Pipeline::start(*kind, &settings, parts(*kind)?).await?;
                let bus = pipeline.bus();
                let (registry, fail, name, mut stopped) =
                    (registry.clone(), fail.clone(), name.clone(), stopped.clone());
                // The pipeline itself is the answer feed: it also reports a failed stage.
                actix::spawn(async move {
                    loop {
                        let record = tokio::select! {
                            record = pipeline.next_record() => record,
                            _ = stopped.wait_for(|stop| *stop) => break,
                        };
                        match record {
                            Ok(record) => registry.finish(&name, VersionedAnswer::from(record)),
                            Err(error) => {
                                fail.send_replace(Some(format!("pipeline {name}: {error}")));
                                break;
                            }
                        }
                    }
                    pipeline.stop();
                });
                let progress = bus.subscribe(&[Topic::Progress], &format!("serve-{replica}-progress")).await?;
                (bus, progress)
            }
            Transport::Kafka => {
                let kafka = kind.kafka_bus(&settings).await?;
                // A new replica reads the recent past, not whole topics, and is ready once it has
                // read what was there when it started.
                let since =
                    std::time::SystemTime::now() - std::time::Duration::from_secs(settings.serve.replay_window_s);
                let (answers, caught_up) =
                    kafka.follow_since(&[Topic::Answers], &format!("serve-{replica}"), since).await?;
                catching_up.push(caught_up);
                let (ends, pipeline) = (registry.clone(), name.clone());
                let unreadable = move |key: &str, reason: String| {
                    ends.finish(&pipeline, VersionedAnswer::unreadable(key, "serve", &reason))
                };
                let (registry, pipeline) = (registry.clone(), name.clone());
                let take = move |answer: VersionedAnswer| registry.finish(&pipeline, answer);
                spawn_feed(answers, format!("{name} answers"), fail.clone(), take, unreadable);
                let (progress, caught_up) =
                    kafka.follow_since(&[Topic::Progress], &format!("serve-{replica}-progress"), since).await?;
                catching_up.push(caught_up);
                (kafka as Arc<dyn Bus>, progress)
            }
        };
        // Progress is best-effort: an undecodable record costs a watcher a step, nothing more.
        let (registry, pipeline) = (registry.clone(), name.clone());
        let take = move |event: ProgressEvent| registry.progress(&pipeline, event);
        spawn_feed(progress, format!("{name} progress"), fail.clone(), take, |_, _| ());
        buses.insert(name, bus);
    }
    let mut stage_names: Vec<&'static str> = Vec::new();
    for kind in &options.pipelines {
        for stage in kind.stages() {
            if !stage_names.contains(&stage.name) {
                stage_names.push(stage.name);
            }
        }
    }
    let documents = Arc::new(DocumentRoutes {
        token: documents_token,
        target: match options.transport {
            Transport::InProcess if settings.search.backend == SearchBackend::Meilisearch => {
                let meili = MeiliSearch::new(settings.search.meilisearch.clone())?;
                Target::Meili { meili, opened: tokio::sync::OnceCell::new() }
            }
            Transport::InProcess => {
                Target::Local { dir: settings.search.index_dir.clone(), writing: Default::default() }
            }
            Transport::Kafka => {
                let bus = KafkaBus::new(settings.kafka.clone(), &settings.bus)?;
                bus.ensure_documents_topic().await?;
                Target::Kafka(Arc::new(bus))
            }
        },
        max_document_bytes: settings.search.max_document_bytes,
        passage_words: settings.search.passage_words,
        body_timeout: std::time::Duration::from_millis(settings.serve.body_timeout_ms),
    });
    let ready = Arc::new(AtomicBool::new(false));
    let api = Arc::new(Api {
        registry: registry.clone(),
        buses,
        default_pipeline: options.pipelines[0].name().to_string(),
        settings: settings.serve.clone(),
        token,
        max_question_chars: settings.run.max_question_chars,
        transport: options.transport,
        stage_names,
        ready: ready.clone(),
        streams: Arc::new(tokio::sync::Semaphore::new(settings.serve.max_event_streams.max(1))),
        documents,
    });
    let listener = tokio::net::TcpListener::bind(&options.listen)
        .await
        .map_err(|e| anyhow::anyhow!("serve.listen {}: {e}", options.listen))?;
    let address = listener.local_addr()?;
    let (router, _) = openapi::router(api, ready.clone());
    let limits = observe::ConnectionLimits {
        header_timeout: observe::HEADER_TIMEOUT,
        max_connections: settings.serve.max_connections,
        retry_after_s: settings.serve.retry_after_s,
    };
    observe::serve_http(listener, router, limits);
    let caught_up = ready.clone();
    if catching_up.is_empty() {
        ready.store(true, Ordering::Relaxed);
    }
    tokio::spawn(async move {
        for mut feed in catching_up {
            if feed.wait_for(|done| *done).await.is_err() {
                // The feed ended: its failure is reported by spawn_feed; never ready.
                return;
            }
        }
        tracing::info!("serve is ready: the replay window is read");
        caught_up.store(true, Ordering::Relaxed);
    });
    Ok(Server { address, registry, failure, stop })
}

/// Every record of `feed` decoded and handed to `take`, acknowledged once taken. An undecodable
/// one goes to `unreadable` with the reason (an answer still ends its question; progress is skipped).
/// A feed that ends fails the server: nothing more can come through it.
fn spawn_feed<E: Event>(
    mut feed: Box<dyn Subscription>,
    what: String,
    fail: Arc<watch::Sender<Option<String>>>,
    take: impl Fn(E) + 'static,
    unreadable: impl Fn(&str, String) + 'static,
) {
    actix::spawn(async move {
        while let Some(delivery) = feed.next().await {
            match E::from_payload(&delivery.record.payload) {
                Ok(event) => take(event),
                Err(error) => {
                    tracing::warn!(%error, key = %delivery.record.key, feed = %what, "undecodable record");
                    unreadable(&delivery.record.key, error.to_string());
                }
            }
            delivery.ack();
        }
        fail.send_replace(Some(format!("the {what} feed ended")));
    });
}
