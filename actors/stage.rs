//! The machinery every stage shares: an actix actor that takes deliveries from the bus, runs the
//! stage's logic with a bounded number in flight, retries transient failures, publishes the outputs,
//! and only then acknowledges the input. A question whose event keeps failing ends in an error record
//! (and a dead letter), never in silence.

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot, watch};
use tracing::Instrument;

use crate::actors::answer::error_record;
use crate::actors::clients::{LlmError, ModelError, NliError, SearchError};
use crate::actors::dedupe::{Window, fingerprint};
use crate::actors::fanout::{child_memory, result_record};
use crate::actors::key_order::KeyOrder;
use crate::metrics::METRICS;
use crate::settings::{BudgetSettings, RetrySettings, Settings, StageSettings, backoff};
use crate::topics::dead_letter::DeadLetter;
use crate::topics::{Bus, BusError, DecodeError, Delivery, ErrorRecord, Event, Record, Topic, TraceKind, TraceStep};

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
            StageError::Model(_) | StageError::Nli(NliError::Model(_)) => "model",
            StageError::Bus(BusError::Rejected(_)) => "publish_rejected",
            StageError::Bus(_) => "bus",
            StageError::BudgetExceeded(_) => "budget_exceeded",
        }
    }

    /// Worth retrying the whole event: a later attempt may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            StageError::Llm(e) | StageError::Nli(NliError::Llm(e)) => e.is_transient(),
            StageError::Search(error) => error.is_transient(),
            StageError::Bus(BusError::Rejected(_)) => false,
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
    fn check(&self, stage: &str, records: &[Record]) {
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

fn bump(counter: &AtomicU64) {
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
            dedupe_window: settings.bus.dedupe_window,
            progress: settings.bus.progress_timeout(),
        }
    }
}

/// Where a started stage stands: what `/readyz`, `lacuna stage` and an in-process run watch.
#[derive(Clone, Debug, PartialEq)]
pub enum StageState {
    Running,
    /// Stopped or drained on request.
    Stopped,
    /// It can do no more work: its feed or actor died, or an outcome could not be published.
    Failed(String),
}

/// The shared, watchable state of one running stage.
#[derive(Clone)]
struct Health {
    name: &'static str,
    state: Arc<watch::Sender<StageState>>,
}

impl Health {
    fn fail(&self, reason: String) {
        if self.leave_running(StageState::Failed(reason.clone())) {
            METRICS.stage_failures.with_label_values(&[self.name]).inc();
            tracing::error!(stage = self.name, %reason, "stage failed");
        }
    }

    fn stop(&self) {
        self.leave_running(StageState::Stopped);
    }

    /// Moves a running stage to `next`; a stage that already stopped or failed stays as it is.
    fn leave_running(&self, next: StageState) -> bool {
        self.state.send_if_modified(|state| {
            let running = *state == StageState::Running;
            if running {
                *state = next;
            }
            running
        })
    }
}

/// Held by the stage's feeder for as long as it runs: a feeder that ends without saying why (a
/// panic on the stage's thread, its arbiter stopped under it) fails the stage.
struct FeederGuard(Health);

impl Drop for FeederGuard {
    fn drop(&mut self) {
        self.0.fail("its feeder ended unexpectedly (a panic on the stage's thread?)".into());
    }
}

pub struct StageActor<S: Stage> {
    stage: Rc<S>,
    bus: Arc<dyn Bus>,
    runner: RunnerSettings,
    finished: Rc<Option<Window>>,
    /// Events of one question wait for its earlier ones.
    key_order: KeyOrder,
    counters: Arc<StageCounters>,
    wiring: Wiring,
    health: Health,
}

impl<S: Stage> Actor for StageActor<S> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // The feeder holds a slot per event it sends, so the mailbox never holds more than
        // max_in_flight of them: that is the one bound (actix's default, 16, would be a second).
        ctx.set_mailbox_capacity(self.runner.max_in_flight);
    }
}

/// A delivery plus the in-flight slot it occupies until it is fully handled.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Process {
    pub delivery: Delivery,
    pub slot: OwnedSemaphorePermit,
}

impl<S: Stage> Handler<Process> for StageActor<S> {
    // A ResponseFuture is spawned, so several events are processed at once (the slot bounds how
    // many), those of one key one after the other.
    type Result = ResponseFuture<()>;

    fn handle(&mut self, message: Process, _ctx: &mut Self::Context) -> Self::Result {
        let (stage, bus, counters) = (self.stage.clone(), self.bus.clone(), self.counters.clone());
        let (runner, wiring, health) = (self.runner.clone(), self.wiring, self.health.clone());
        let finished = self.finished.clone();
        // Taken here, in arrival order, not in the future below, which may first run later.
        let mut turn = self.key_order.take(&message.delivery.record.key);
        Box::pin(async move {
            turn.wait().await;
            let context = Handling {
                bus: &*bus,
                runner: &runner,
                counters: &counters,
                wiring,
                health: &health,
                finished: &finished,
            };
            handle_delivery(&*stage, &context, message.delivery).await;
            drop(turn);
            drop(message.slot);
        })
    }
}

/// The timer of a stage with [`Stage::tick_every`].
#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

impl<S: Stage> Handler<Tick> for StageActor<S> {
    // Atomic: two ticks never overlap, and events wait while a tick decides.
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Tick, _ctx: &mut Self::Context) -> Self::Result {
        let stage = self.stage.clone();
        AtomicResponse::new(Box::pin(async move { stage.tick().await }.into_actor(self)))
    }
}

/// What handling one delivery needs besides the stage.
struct Handling<'a> {
    bus: &'a dyn Bus,
    runner: &'a RunnerSettings,
    counters: &'a StageCounters,
    wiring: Wiring,
    health: &'a Health,
    /// The events this stage finished lately (`None`: it skips nothing).
    finished: &'a Option<Window>,
}

async fn handle_delivery<S: Stage>(stage: &S, context: &Handling<'_>, delivery: Delivery) {
    bump(&context.counters.received);
    let m = &METRICS;
    m.events_received.with_label_values(&[S::NAME]).inc();
    let in_flight = m.in_flight.with_label_values(&[S::NAME]);
    in_flight.inc();
    let timer = m.processing_seconds.with_label_values(&[S::NAME]).start_timer();
    let memory = peek(&delivery.record.payload);
    // At error level so that any filter keeps it: every line logged inside carries its context.
    let span = tracing::error_span!(
        "event",
        stage = S::NAME,
        question_id = %delivery.record.key,
        iteration = memory.as_ref().map_or(0, |m| m.iteration),
        attempt = delivery.attempt,
    );
    // What the question already spent does not change between attempts: checked once.
    let over_budget = memory.and_then(|m| context.runner.budget.exceeded(&m.usage));
    handle_with_retries(stage, context, delivery, over_budget).instrument(span).await;
    timer.observe_duration();
    in_flight.dec();
}

async fn handle_with_retries<S: Stage>(
    stage: &S,
    context: &Handling<'_>,
    delivery: Delivery,
    over_budget: Option<String>,
) {
    let (m, retry) = (&METRICS, &context.runner.retry);
    let fingerprint = context.finished.as_ref().and_then(|_| fingerprint(&delivery.record));
    if let (Some(window), Some(fingerprint)) = (context.finished, fingerprint)
        && window.contains(fingerprint)
    {
        m.duplicates_skipped.with_label_values(&[S::NAME]).inc();
        tracing::info!(stage = S::NAME, key = %delivery.record.key, "already finished this event: skipped");
        delivery.ack();
        return;
    }
    // Tries of this delivery; its own attempt number counts those of earlier dead-letter replays.
    let mut attempt = 1;
    let outcome = loop {
        if let Some(reason) = over_budget {
            break Err(StageError::BudgetExceeded(reason));
        }
        match stage.process(&delivery.record).await {
            Ok(outputs) => break Ok(outputs),
            Err(error) if error.is_transient() && attempt < retry.max_attempts => {
                bump(&context.counters.retried);
                m.retries.with_label_values(&[S::NAME]).inc();
                tracing::warn!(stage = S::NAME, key = %delivery.record.key, attempt, %error, "retrying event");
                tokio::time::sleep(backoff(retry.backoff_ms, attempt)).await;
                attempt += 1;
            }
            Err(error) => break Err(error),
        }
    };
    let tries = delivery.attempt.max(1) + attempt - 1;
    let (outputs, mut failure) = match outcome {
        Ok(outputs) => {
            context.wiring.check(S::NAME, &outputs);
            // Before the outputs, so no later stage's progress can overtake this one's: watchers see
            // a question's steps in the order they happened (one key, one partition or queue).
            if let Some(timeout) = context.runner.progress {
                let progress = crate::topics::progress::progress_records(S::NAME, &delivery.record, &outputs);
                publish_progress(S::NAME, context.bus, context.runner.max_event_bytes, progress, timeout).await;
            }
            (outputs, None)
        }
        Err(error) => {
            tracing::error!(stage = S::NAME, key = %delivery.record.key, error_type = error.error_type(), %error, "event failed");
            (failure_records(S::NAME, &delivery.record, &error, tries), Some(error.error_type()))
        }
    };
    let mut published = publish_all(S::NAME, context, outputs).await;
    if let Published::Rejected(reason) = published {
        // No retry helps a record the bus will never take: the question ends here, with the reason.
        let error = StageError::Bus(BusError::Rejected(reason));
        tracing::error!(stage = S::NAME, key = %delivery.record.key, %error, "an output was rejected: ending its question");
        failure = Some(error.error_type());
        published = publish_all(S::NAME, context, failure_records(S::NAME, &delivery.record, &error, tries)).await;
    }
    match published {
        Published::All(count) => {
            // Counted once published: a redelivered event is not counted twice.
            context.counters.sent.fetch_add(count, Ordering::Relaxed);
            m.events_sent.with_label_values(&[S::NAME]).inc_by(count);
            match failure {
                Some(error_type) => {
                    bump(&context.counters.failed);
                    m.events_failed.with_label_values(&[S::NAME, error_type]).inc();
                    m.dead_letters.with_label_values(&[S::NAME]).inc();
                }
                // Only work that went through counts as finished: a dead letter replayed later
                // must run again.
                None => {
                    if let (Some(window), Some(fingerprint)) = (context.finished, fingerprint) {
                        window.insert(fingerprint);
                    }
                }
            }
            delivery.ack();
        }
        Published::Rejected(reason) | Published::Failed(reason) => {
            // Neither the outcome nor the error record can go out: leaving a hole in the partition
            // would stall it for good, so the stage fails and a restart reads the event again.
            let reason = format!("cannot publish the outcome of {}'s event: {reason}", delivery.record.key);
            context.health.fail(reason.clone());
            delivery.nack(&reason);
        }
    }
}

/// How publishing one event's outputs went.
enum Published {
    /// Every record is out (how many).
    All(u64),
    /// The bus will never take one of them.
    Rejected(String),
    /// The bus stayed unavailable through every attempt.
    Failed(String),
}

/// Publishes `records` in order, each trimmed to fit the size limit and retried on transient
/// errors; stops at the first that cannot go out.
async fn publish_all(stage: &'static str, context: &Handling<'_>, records: Vec<Record>) -> Published {
    let mut count = 0;
    for record in records {
        let record = match crate::topics::size::fit(record, context.runner.max_event_bytes) {
            Ok(record) => record,
            Err(reason) => return Published::Rejected(reason),
        };
        match publish_with_retries(stage, context, record).await {
            Ok(()) => count += 1,
            Err(BusError::Rejected(reason)) => return Published::Rejected(reason),
            Err(error) => return Published::Failed(error.to_string()),
        }
    }
    Published::All(count)
}

async fn publish_with_retries(stage: &'static str, context: &Handling<'_>, record: Record) -> Result<(), BusError> {
    let retry = &context.runner.retry;
    let mut attempt = 1;
    loop {
        match context.bus.publish(record.clone()).await {
            Err(BusError::Transport(message)) if attempt < retry.publish_attempts => {
                METRICS.publish_retries.with_label_values(&[stage]).inc();
                tracing::warn!(stage, topic = record.topic.name(), attempt, %message, "publish failed, retrying");
                tokio::time::sleep(backoff(retry.backoff_ms, attempt)).await;
                attempt += 1;
            }
            outcome => return outcome,
        }
    }
}

/// Publishes progress records: each gets one try of at most `timeout`, and one that fails, is too
/// large or too slow is counted and dropped, never failing or holding up the event for longer.
/// Watchers lose a few steps; the question loses nothing (its answer record carries the whole trace).
/// Steps published for an event whose outputs then fail are published again when it is redone;
/// readers keep one copy per (node, index). The join, which publishes past the runner, calls it too.
pub async fn publish_progress(
    stage: &'static str,
    bus: &dyn Bus,
    max_event_bytes: usize,
    records: Vec<Record>,
    timeout: Duration,
) {
    for record in records {
        let published = if record.payload.len() > max_event_bytes {
            false
        } else {
            matches!(tokio::time::timeout(timeout, bus.publish(record)).await, Ok(Ok(())))
        };
        if !published {
            METRICS.progress_dropped.with_label_values(&[stage]).inc();
        }
    }
}

/// The error record that ends the question, and the dead letter that keeps the failed event after
/// `attempts` tries. A failed sub-question or trajectory does not end its root question: its parent
/// hears of it through the join as a child that found no answer.
pub fn failure_records(stage: &str, input: &Record, error: &StageError, attempts: u32) -> Vec<Record> {
    let dead_letter = DeadLetter::new(stage, error.error_type(), &error.to_string(), input, attempts).to_record();
    if let Some(mut memory) = child_memory(&input.payload) {
        memory.record(
            stage,
            TraceKind::Failed { error_type: error.error_type().to_string(), message: error.to_string() },
        );
        return vec![result_record(memory, Vec::new()), dead_letter];
    }
    let (question, trace) = question_and_trace(&input.payload);
    let record = ErrorRecord {
        question_id: input.key.clone(),
        question,
        stage: stage.to_string(),
        error_type: error.error_type().to_string(),
        message: error.to_string(),
        trace,
    };
    vec![error_record(record), dead_letter]
}

/// What the runner reads of an event's memory before the stage decodes it: its iteration for log
/// lines, and what its question spent for the budget (`None` for events without memory).
#[derive(serde::Deserialize)]
struct Peeked {
    #[serde(default)]
    iteration: u64,
    #[serde(default)]
    usage: crate::topics::Usage,
}

fn peek(payload: &[u8]) -> Option<Peeked> {
    #[derive(serde::Deserialize)]
    struct Event {
        memory: Option<Peeked>,
    }
    serde_json::from_slice::<Event>(payload).ok()?.memory
}

/// Reads what it can of a payload that may not decode as its event type.
fn question_and_trace(payload: &[u8]) -> (String, Vec<TraceStep>) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
        return (String::new(), Vec::new());
    };
    let question = value["memory"]["question"].as_str().or(value["question"].as_str()).unwrap_or_default().to_string();
    let trace = serde_json::from_value(value["memory"]["trace"].clone()).unwrap_or_default();
    (question, trace)
}

/// A stage running on its own arbiter (thread), fed from the bus.
pub struct RunningStage {
    pub name: &'static str,
    pub counters: Arc<StageCounters>,
    arbiter: Arbiter,
    stop_feeding: Arc<Notify>,
    drained: Option<oneshot::Receiver<()>>,
    health: Health,
}

impl RunningStage {
    /// Stops at once; events in flight are abandoned (a durable bus redelivers them).
    pub fn stop(&self) {
        self.health.stop();
        self.arbiter.stop();
    }

    /// Graceful shutdown: takes no new event, waits for those in flight to finish and be
    /// acknowledged, commits the bus position, then stops.
    pub async fn drain(mut self) {
        self.health.stop();
        self.stop_feeding.notify_one();
        if let Some(drained) = self.drained.take() {
            let _ = drained.await;
        }
        self.arbiter.stop();
    }

    /// Resolves with the reason once the stage has failed; never while it runs or after a stop.
    pub async fn failed(&self) -> String {
        let mut state = self.health.state.subscribe();
        // The sender lives in `self`, so the watch cannot close while this waits.
        if let Ok(state) = state.wait_for(|s| matches!(s, StageState::Failed(_))).await
            && let StageState::Failed(reason) = &*state
        {
            return reason.clone();
        }
        std::future::pending().await
    }
}

/// Opens `stage`, subscribes it to its wiring's inputs and starts it. At most `max_in_flight` events
/// are taken from the bus before earlier ones finish: the slot is acquired *before* the next record
/// is read, so a busy stage stops consuming and its input topic fills up, slowing its producers.
pub async fn spawn_stage<S: Stage>(
    stage: S,
    bus: Arc<dyn Bus>,
    wiring: Wiring,
    runner: RunnerSettings,
) -> Result<RunningStage, BusError> {
    stage.open(&bus).await?;
    let mut subscription = bus.subscribe(wiring.inputs, S::NAME).await?;
    let tick_every = stage.tick_every();
    let counters = Arc::new(StageCounters::default());
    let health = Health { name: S::NAME, state: Arc::new(watch::channel(StageState::Running).0) };
    let arbiter = Arbiter::new();
    let max_in_flight = runner.max_in_flight;
    let (actor_bus, actor_counters, actor_health) = (bus.clone(), counters.clone(), health.clone());
    let addr = StageActor::start_in_arbiter(&arbiter.handle(), move |_| StageActor {
        stage: Rc::new(stage),
        bus: actor_bus,
        finished: Rc::new(Window::new(runner.dedupe_window)),
        key_order: KeyOrder::default(),
        runner,
        counters: actor_counters,
        wiring,
        health: actor_health,
    });
    if let Some(every) = tick_every {
        let addr = addr.clone();
        arbiter.spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                if addr.send(Tick).await.is_err() {
                    break;
                }
            }
        });
    }
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let stop_feeding = Arc::new(Notify::new());
    let (drained_tx, drained) = oneshot::channel();
    let (stop, guard) = (stop_feeding.clone(), FeederGuard(health.clone()));
    let mut failures = health.state.subscribe();
    arbiter.spawn(async move {
        let health = &guard.0;
        loop {
            let slot = tokio::select! {
                _ = stop.notified() => break,
                _ = failures.wait_for(|s| matches!(s, StageState::Failed(_))) => break,
                slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            };
            let delivery = tokio::select! {
                _ = stop.notified() => break,
                _ = failures.wait_for(|s| matches!(s, StageState::Failed(_))) => break,
                delivery = subscription.next() => match delivery {
                    Some(delivery) => delivery,
                    None => {
                        health.fail("its feed from the bus ended (the consumer stopped or its poller died)".into());
                        break;
                    }
                },
            };
            // A record whose partition moved away while it waited is its new owner's to process.
            let Some(delivery) = delivery.claim() else { continue };
            // Handed over, not awaited: `send` would resolve only once the event was handled, and
            // the stage would take one event at a time whatever its max_in_flight. The slots bound
            // the mailbox, so it always has room.
            if let Err(error) = addr.try_send(Process { delivery, slot }) {
                let reason = match error {
                    SendError::Full(_) => "its mailbox was full despite the in-flight bound",
                    SendError::Closed(_) => "its actor stopped",
                };
                health.fail(reason.into());
                break;
            }
        }
        // Every slot back means every event taken has finished and been acknowledged.
        let _all = slots.acquire_many(max_in_flight as u32).await;
        if let Err(error) = subscription.commit().await {
            tracing::error!(stage = S::NAME, %error, "final commit failed");
        }
        // Ended as asked, or already failed with its reason: the guard has nothing to add.
        health.stop();
        let _ = drained_tx.send(());
    });
    Ok(RunningStage { name: S::NAME, counters, arbiter, stop_feeding, drained: Some(drained), health })
}

/// Decodes the event of a record, checking its schema version.
pub fn decode<E: Event>(record: &Record) -> Result<E, StageError> {
    Ok(E::from_payload(&record.payload)?)
}
