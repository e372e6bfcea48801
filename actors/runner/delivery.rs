//! One delivery, handled: the budget checked, the stage run with retries on transient errors, the
//! outputs published (trimmed to fit, retried), and only then the input acknowledged. An event that
//! keeps failing ends its question in an error record and a dead letter.

use std::sync::atomic::Ordering;

use opentelemetry::KeyValue;
use opentelemetry::trace::{FutureExt as _, SpanKind, Status, TraceContextExt as _};
use tracing::Instrument;

use super::dedupe::{Window, fingerprint};
use super::health::Health;
use super::publish::{publish_progress, publish_record};
use super::{RunnerSettings, Stage, StageCounters, StageError, Wiring, bump};
use crate::actors::clients::{attempt_spend, backoff};
use crate::actors::shared::answer::error_record;
use crate::actors::shared::fanout::{child_memory, result_record};
use crate::metrics::METRICS;
use crate::topics::bus::atomically;
use crate::topics::dead_letter::DeadLetter;
use crate::topics::{
    Bus, BusError, Delivery, ErrorRecord, Event, Provenance, Record, Topic, TraceKind, TraceStep, Usage,
    VersionedAnswer,
};

/// What handling one delivery needs besides the stage.
pub(super) struct Handling<'a> {
    pub(super) bus: &'a dyn Bus,
    pub(super) runner: &'a RunnerSettings,
    pub(super) counters: &'a StageCounters,
    pub(super) wiring: Wiring,
    pub(super) health: &'a Health,
    /// The events this stage finished lately (`None`: it skips nothing).
    pub(super) finished: &'a Option<Window>,
}

pub(super) async fn handle_delivery<S: Stage>(stage: &S, context: &Handling<'_>, delivery: Delivery) {
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
        redeliveries = delivery.redeliveries,
    );
    let trace = stage_span(S::NAME, &delivery, memory.as_ref().map_or(0, |m| m.iteration));
    let usage = memory.map(|m| m.usage);
    // The stage's LLM calls, searches and publishes happen in its span: children, and the context
    // its outputs carry on.
    let handled = if S::PUBLISHES_ITSELF {
        // Its own publishes inside `process` belong with the outputs and the acknowledgement.
        atomically(context.bus, handle_with_retries(stage, context, delivery, usage))
            .instrument(span)
            .with_context(trace.clone())
            .await
    } else {
        handle_with_retries(stage, context, delivery, usage).instrument(span).with_context(trace.clone()).await
    };
    handled.end(&trace);
    timer.observe_duration();
    in_flight.dec();
}

async fn handle_with_retries<S: Stage>(
    stage: &S,
    context: &Handling<'_>,
    delivery: Delivery,
    usage: Option<Usage>,
) -> Handled {
    let (m, retry) = (&METRICS, &context.runner.retry);
    let fingerprint = context.finished.as_ref().and_then(|_| fingerprint(&delivery.record));
    if let (Some(window), Some(fingerprint)) = (context.finished, fingerprint)
        && window.contains(fingerprint)
    {
        m.duplicates_skipped.with_label_values(&[S::NAME]).inc();
        tracing::info!(stage = S::NAME, key = %delivery.record.key, "already finished this event: skipped");
        delivery.ack();
        return Handled::Skipped;
    }
    // Tries of this delivery; its own attempt number counts those of earlier dead-letter replays.
    let mut attempt = 1;
    // What this delivery's failed attempts spent: the question pays for them too, so one that
    // keeps failing a stage still stops at its budget.
    let mut failed_spend = Usage::default();
    let outcome = if let Some(reason) = delivery.rejected.clone() {
        // Exactly-once: the broker refused an output of this very record before, and that
        // transaction was aborted. Redone, it would be refused again: the question ends here.
        Err(StageError::Bus(BusError::Rejected(reason)))
    } else {
        loop {
            // A record that crashed the processes that started it would crash this one too.
            if delivery.redeliveries >= retry.max_attempts {
                break Err(StageError::Redelivered(delivery.redeliveries));
            }
            let over_budget = usage.as_ref().and_then(|usage| {
                let mut spent = usage.clone();
                spent.add(&failed_spend);
                spent.over_budget(&context.runner.budget)
            });
            if let Some(reason) = over_budget {
                break Err(StageError::BudgetExceeded(reason));
            }
            let (outcome, spent) = attempt_spend::counting(stage.process(&delivery.record)).await;
            match outcome {
                Ok(outputs) => break Ok(charged(outputs, &failed_spend)),
                Err(error) if error.is_transient() && attempt < retry.max_attempts => {
                    failed_spend.add(&spent);
                    bump(&context.counters.retried);
                    m.retries.with_label_values(&[S::NAME]).inc();
                    tracing::warn!(stage = S::NAME, key = %delivery.record.key, attempt, %error, "retrying event");
                    tokio::time::sleep(backoff(retry.backoff_ms, attempt)).await;
                    attempt += 1;
                }
                Err(error) => break Err(error),
            }
        }
    };
    let tries = delivery.attempt.max(1) + delivery.redeliveries + attempt - 1;
    let (outputs, failure) = match outcome {
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
    // On an exactly-once bus, no transaction commits between the first output and the ack.
    atomically(context.bus, finish::<S>(context, delivery, (outputs, failure), (tries, fingerprint))).await
}

/// Publishes an event's outputs (or, failing that, its error records) and acknowledges it.
async fn finish<S: Stage>(
    context: &Handling<'_>,
    delivery: Delivery,
    (outputs, mut failure): (Vec<Record>, Option<&'static str>),
    (tries, fingerprint): (u32, Option<u128>),
) -> Handled {
    let m = &METRICS;
    // Checked inside the hold, where no revocation can come between the check and the outputs.
    if !delivery.owned() {
        tracing::warn!(
            stage = S::NAME,
            key = %delivery.record.key,
            "its partition was revoked while this event was processed: the new owner does it, its outcome here is dropped"
        );
        m.events_let_go.with_label_values(&[S::NAME]).inc();
        delivery.let_go();
        return Handled::LetGo;
    }
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
                        // Asked inside the hold: the transaction these outputs went into.
                        window.insert(fingerprint, context.bus.open_transaction());
                    }
                }
            }
            delivery.ack();
            Handled::Done(failure)
        }
        Published::Aborted(rejected) => {
            tracing::warn!(
                stage = S::NAME,
                key = %delivery.record.key,
                rejected = rejected.as_deref().unwrap_or(""),
                "the transaction of this event's outputs was aborted: it comes again from the last commit"
            );
            m.events_let_go.with_label_values(&[S::NAME]).inc();
            delivery.let_go_aborted(rejected);
            Handled::LetGo
        }
        // The error types are those `StageError::Bus` has for the same bus errors.
        Published::Rejected(reason) => refuse(context, delivery, "publish_rejected", &reason),
        Published::Failed(reason) => refuse(context, delivery, "bus", &reason),
    }
}

/// Neither the outcome nor the error record can go out: leaving a hole in the partition would stall
/// it for good, so the stage fails and a restart reads the event again.
fn refuse(context: &Handling<'_>, delivery: Delivery, error_type: &'static str, reason: &str) -> Handled {
    let reason = format!("cannot publish the outcome of {}'s event: {reason}", delivery.record.key);
    context.health.fail(reason.clone());
    delivery.nack(&reason);
    Handled::Refused(error_type, reason)
}

/// How an event's handling ended, for its span.
enum Handled {
    /// Finished before (the dedupe window): acknowledged, nothing done.
    Skipped,
    /// Its outputs published and the event acknowledged; with the `error_type` when they are its
    /// question's error record and dead letter.
    Done(Option<&'static str>),
    /// Its partition moved away meanwhile: the new owner does it.
    LetGo,
    /// Its outcome could not be published: refused (with the bus error's `error_type`), and the
    /// stage fails.
    Refused(&'static str, String),
}

impl Handled {
    /// Ends the event's span with the outcome, an error status for a failure.
    fn end(self, trace: &opentelemetry::Context) {
        let span = trace.span();
        let outcome = match &self {
            Handled::Skipped => "skipped_duplicate",
            Handled::Done(None) => "published",
            Handled::Done(Some(_)) => "failed",
            Handled::LetGo => "let_go",
            Handled::Refused(..) => "refused",
        };
        span.set_attribute(KeyValue::new("lacuna.outcome", outcome));
        match self {
            Handled::Done(Some(error_type)) => {
                span.set_attribute(KeyValue::new("error.type", error_type));
                span.set_status(Status::error(error_type));
            }
            Handled::Refused(error_type, reason) => {
                span.set_attribute(KeyValue::new("error.type", error_type));
                span.set_status(Status::error(reason));
            }
            _ => {}
        }
        span.end();
    }
}

/// The span of one event handled by `stage`: a child of its question's root span, linked to the
/// span that published the record (`telemetry/context.rs`), with where it was read from and which
/// try this is.
fn stage_span(stage: &'static str, delivery: &Delivery, iteration: u64) -> opentelemetry::Context {
    let record = &delivery.record;
    let mut attributes = vec![
        KeyValue::new("lacuna.stage", stage),
        KeyValue::new("lacuna.question_id", record.key.clone()),
        KeyValue::new("lacuna.iteration", iteration as i64),
        KeyValue::new("lacuna.attempt", i64::from(delivery.attempt)),
        KeyValue::new("lacuna.redeliveries", i64::from(delivery.redeliveries)),
        KeyValue::new("lacuna.replica", crate::telemetry::replica()),
        KeyValue::new("messaging.operation.type", "process"),
        KeyValue::new("messaging.destination.name", record.topic.name()),
        KeyValue::new("openinference.span.kind", "CHAIN"),
    ];
    if let Some((partition, offset)) = delivery.position {
        attributes.push(KeyValue::new("messaging.system", "kafka"));
        attributes.push(KeyValue::new("messaging.destination.partition.id", partition.to_string()));
        attributes.push(KeyValue::new("messaging.kafka.offset", offset));
    }
    let (parent, links) = crate::telemetry::record_parent(&record.trace);
    crate::telemetry::linked_span(stage, SpanKind::Consumer, &parent, links, attributes)
}

/// How publishing one event's outputs went.
enum Published {
    /// Every record is out (how many).
    All(u64),
    /// The bus will never take one of them.
    Rejected(String),
    /// The bus stayed unavailable through every attempt.
    Failed(String),
    /// Exactly-once: the transaction they went into is aborted, and the event comes again; with
    /// why the broker refused one of them, when it will always.
    Aborted(Option<String>),
}

/// Publishes `records` in order, each trimmed to fit the size limit and retried on transient
/// errors; stops at the first that cannot go out.
async fn publish_all(stage: &'static str, context: &Handling<'_>, records: Vec<Record>) -> Published {
    let mut count = 0;
    for record in records {
        let record = match &context.runner.provenance {
            Some(provenance) => stamped(record, provenance),
            None => record,
        };
        let record = match crate::topics::size::fit(record, context.runner.max_event_bytes) {
            Ok(record) => record,
            Err(reason) => return Published::Rejected(reason),
        };
        match publish_record(context.bus, &context.runner.retry, stage, record).await {
            Ok(()) => count += 1,
            Err(BusError::Rejected(reason)) => return Published::Rejected(reason),
            Err(BusError::Aborted { rejected, .. }) => return Published::Aborted(rejected),
            Err(error) => return Published::Failed(error.to_string()),
        }
    }
    Published::All(count)
}

/// An answer record with the provenance of the answer it holds (the index generations its own
/// retrievals read); any other record as it is. A record another process already stamped keeps its
/// stamp.
fn stamped(record: Record, provenance: &Provenance) -> Record {
    if record.topic != Topic::Answers {
        return record;
    }
    let Ok(mut answer) = VersionedAnswer::from_payload(&record.payload) else { return record };
    let (stamp, trace) = answer.record.provenance_and_trace();
    if stamp.is_some() {
        return record;
    }
    let mut provenance = provenance.for_trace(trace);
    provenance.trace_id = crate::telemetry::current_trace_id();
    *stamp = Some(provenance);
    answer.to_record()
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
        provenance: None,
    };
    vec![error_record(record), dead_letter]
}

/// `outputs` with what earlier failed attempts spent added to their question's usage, so the stages
/// downstream and the answer record see it. Outputs without memory pass as they are.
fn charged(outputs: Vec<Record>, failed_spend: &Usage) -> Vec<Record> {
    if failed_spend.llm_calls == 0 {
        return outputs;
    }
    let charge = |mut record: Record| {
        let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&record.payload) else { return record };
        let Some(usage) = value.pointer_mut("/memory/usage") else { return record };
        let Ok(mut spent) = serde_json::from_value::<Usage>(usage.clone()) else { return record };
        spent.add(failed_spend);
        *usage = serde_json::to_value(&spent).expect("usage serialises");
        record.payload = serde_json::to_vec(&value).expect("a JSON value serialises");
        record
    };
    outputs.into_iter().map(charge).collect()
}

/// What the runner reads of an event's memory before the stage decodes it: its iteration for log
/// lines, and what its question spent for the budget (`None` for events without memory).
#[derive(serde::Deserialize)]
struct Peeked {
    #[serde(default)]
    iteration: u64,
    #[serde(default)]
    usage: Usage,
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
