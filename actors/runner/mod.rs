//! The machinery every stage shares: an actix actor that takes deliveries from the bus, runs the
//! stage's logic with a bounded number in flight, retries transient failures, publishes the outputs,
//! and only then acknowledges the input. A question whose event keeps failing ends in an error record
//! (and a dead letter), never in silence.
//!
//! - `actor`: the actix actor a stage runs in, its feeder from the bus, and its health;
//! - `delivery`: one delivery handled: budget, retries, publishing, acknowledgement, error records;
//! - `health`: where a running stage stands (running, stopped, failed with why);
//! - `publish`: publishing with retries, for stages, `lacuna submit` and documents alike;
//! - `key_order` and `dedupe`: one question's events one after the other, and finished events skipped.

mod actor;
pub mod dedupe;
mod delivery;
mod health;
pub mod key_order;
mod publish;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

pub use actor::{RunningStage, spawn_stage};
pub use delivery::failure_records;
pub use health::StageState;
pub use publish::{publish_documents, publish_progress, publish_record, retry_publish};

use crate::actors::clients::{LlmError, ModelError, NliError, SearchError};
use crate::actors::prompts::NamedPrompt;
use crate::config::{BudgetSettings, RetrySettings, Settings, StageSettings};
use crate::topics::{Bus, BusError, DecodeError, Event, Record, Topic};

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error(transparent)]
    Search(#[from] SearchError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Nli(#[from] NliError),
    #[error(transparent)]
    Bus(#[from] BusError),
    /// The question already spent what `[budget]` allows.
    #[error("over budget: {0}")]
    BudgetExceeded(String),
    /// Earlier processes started this record this many times and never finished it: it crashes the
    /// stage, so it is not started again.
    #[error("started {0} times by processes that crashed before finishing it (retry.max_attempts)")]
    Redelivered(u32),
}

impl StageError {
    /// The fixed set of error types error records and metrics use.
    pub fn error_type(&self) -> &'static str {
        match self {
            StageError::Decode(_) => "bad_event",
            StageError::Llm(e) | StageError::Nli(NliError::Llm(e)) => e.error_type(),
            StageError::Search(SearchError::MissingIndex(_) | SearchError::MissingRemoteIndex { .. }) => {
                "missing_index"
            }
            StageError::Search(_) => "search",
            StageError::Model(ModelError::NotCached(_)) => "rerank_cache_miss",
            StageError::Model(_) | StageError::Nli(NliError::Model(_)) => "model",
            StageError::Bus(BusError::Rejected(_)) => "publish_rejected",
            StageError::Bus(_) => "bus",
            StageError::BudgetExceeded(_) => "budget_exceeded",
            StageError::Redelivered(_) => "too_many_redeliveries",
        }
    }

    /// Worth retrying the whole event: a later attempt may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            StageError::Llm(e) | StageError::Nli(NliError::Llm(e)) => e.is_transient(),
            StageError::Search(error) => error.is_transient(),
            // Its transaction is gone: the event comes again once the bus has rewound.
            StageError::Bus(BusError::Rejected(_) | BusError::Aborted { .. }) => false,
            StageError::Bus(_) => true,
            _ => false,
        }
    }
}

/// One stage's logic: turn one input record into output records. Stages keep no per-question state:
/// everything they need travels in the event. Which topics a stage reads and writes is not its own
/// business but its pipeline's declaration's (`pipelines/`), which hands them over as a [`Wiring`].
#[async_trait(?Send)]
pub trait Stage: Send + 'static {
    /// The stage's name: its config section, consumer group, metric label and Deployment.
    const NAME: &'static str;

    /// The stage publishes inside [`Stage::process`] (the join's state) as well as through its
    /// outputs: on an exactly-once bus the runner then holds the transaction open across the
    /// whole event, not only its outputs (fine for a stage that asks no LLM).
    const PUBLISHES_ITSELF: bool = false;

    /// The prompt templates the stage can ask with under `settings`, for the `prompts_sha256` of
    /// an answer's provenance. Declared beside the stage's code, with no default: a new stage says
    /// what it asks (a stage that calls no LLM says so with an empty list), so no prompt a pipeline
    /// can send is left out of the hash.
    fn prompts(settings: &Settings) -> Vec<NamedPrompt>;

    /// Reads what the stage needs before it takes its first event (the join's state); most need
    /// nothing.
    async fn open(&self, _bus: &Arc<dyn Bus>) -> Result<(), BusError> {
        Ok(())
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError>;

    /// How often [`Stage::tick`] runs; `None` (the default) for stages that only react to events.
    fn tick_every(&self) -> Option<Duration> {
        None
    }

    /// Work due on a timer rather than on an event (the join's deadlines). Nothing waits on a tick
    /// to redo it if a publish fails, so a stage with a tick publishes what it decides itself, and
    /// forgets its state only once the bus took the record.
    async fn tick(&self) {}
}

/// The topics a stage reads, in priority order (earlier ones are served first), and those its
/// outputs may go to.
#[derive(Clone, Copy, Debug)]
pub struct Wiring {
    pub inputs: &'static [Topic],
    pub outputs: &'static [Topic],
}

impl Wiring {
    /// A stage that publishes where its declaration does not say breaks the pipeline's graph (and
    /// every tool that follows it): tests, built with debug assertions, stop at once; a release
    /// build says so in its log and delivers the record all the same.
    pub(crate) fn check(&self, stage: &str, records: &[Record]) {
        for record in records.iter().filter(|r| !self.outputs.contains(&r.topic)) {
            tracing::error!(stage, topic = record.topic.name(), "published to a topic its declaration does not list");
            debug_assert!(false, "{stage} published to {}, not among its declared outputs", record.topic.name());
        }
    }
}

/// Counters a running stage keeps, readable by tests and progress reports.
#[derive(Debug, Default)]
pub struct StageCounters {
    pub received: AtomicU64,
    pub sent: AtomicU64,
    pub failed: AtomicU64,
    pub retried: AtomicU64,
}

impl StageCounters {
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// How a stage's runner handles events: how many at once, how often to retry, how large a record
/// it may publish.
#[derive(Clone, Debug)]
pub struct RunnerSettings {
    pub max_in_flight: usize,
    pub retry: RetrySettings,
    pub max_event_bytes: usize,
    pub budget: BudgetSettings,
    pub dedupe_window: usize,
    /// Publish each event's new trace steps to `progress`, waiting at most this long (`bus.progress`).
    pub progress: Option<Duration>,
    /// Stamped on every record the stage publishes to `answers` (`pipelines/provenance.rs`).
    pub provenance: Option<std::sync::Arc<crate::topics::Provenance>>,
}

impl RunnerSettings {
    pub fn new(own: &StageSettings, settings: &Settings) -> Self {
        RunnerSettings {
            // An event makes at least one call at a time: fewer events than LLM slots would leave
            // slots that no event can fill (the cap `lacuna bench` found behind idle LLMs).
            max_in_flight: own.max_in_flight.max(own.llm_concurrency).max(1),
            retry: settings.retry.clone(),
            max_event_bytes: settings.bus.max_event_bytes,
            budget: settings.budget.clone(),
            // Off on a bus with transactions ([`crate::topics::Bus::transactional`]), at spawn.
            dedupe_window: settings.bus.dedupe_window,
            progress: settings.bus.progress_timeout(),
            provenance: None,
        }
    }

    /// These settings, stamping `provenance` on the stage's answer records.
    pub fn with_provenance(mut self, provenance: Option<std::sync::Arc<crate::topics::Provenance>>) -> Self {
        self.provenance = provenance;
        self
    }
}

/// Decodes the event of a record, checking its schema version.
pub fn decode<E: Event>(record: &Record) -> Result<E, StageError> {
    Ok(E::from_payload(&record.payload)?)
}
