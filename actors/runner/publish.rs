//! Publishing with retries, for every writer of the bus: a stage's outputs (`delivery`), `lacuna
//! submit`, and documents (`lacuna ingest`, the freshness bench). A transport error is retried with
//! backoff; anything else is returned at once. Progress records get one short try instead.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};

use crate::actors::clients::backoff;
use crate::actors::clients::search::Document;
use crate::config::RetrySettings;
use crate::metrics::METRICS;
use crate::topics::kafka::KafkaBus;
use crate::topics::{Bus, BusError, Record};

/// Documents published to Kafka at once.
const DOCUMENTS_IN_FLIGHT: usize = 256;

/// Publishes `record`, retrying a transient bus error (`retry.publish_attempts`, with backoff): a
/// broker that restarts or elects a leader delays a record, it does not fail it. `stage` labels the
/// retries' metric and log lines.
pub async fn publish_record(bus: &dyn Bus, retry: &RetrySettings, stage: &str, record: Record) -> Result<(), BusError> {
    retry_publish(retry, stage, record.topic.name(), || bus.publish(record.clone())).await
}

/// Runs `publish` until it succeeds, again after a transport error (`retry.publish_attempts` tries
/// in all, with jittered exponential backoff from `retry.backoff_ms`). Anything else, such as a
/// record too large or a topic that does not exist, is returned at once: a retry cannot mend it.
pub async fn retry_publish<F, Fut>(
    retry: &RetrySettings,
    stage: &str,
    topic: &str,
    mut publish: F,
) -> Result<(), BusError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), BusError>>,
{
    let mut attempt = 1;
    loop {
        match publish().await {
            Err(BusError::Transport(message)) if attempt < retry.publish_attempts => {
                METRICS.publish_retries.with_label_values(&[stage]).inc();
                tracing::warn!(stage, topic, attempt, %message, "publish failed, retrying");
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

/// Publishes `documents` (distinct ids) to the documents topic, many in flight at once, each retried
/// on transient errors (`retry`); returns once the broker has them all.
pub async fn publish_documents(bus: &KafkaBus, retry: &RetrySettings, documents: &[Document]) -> Result<(), BusError> {
    let topic = bus.documents_topic();
    let topic = topic.as_str();
    let published = futures::stream::iter(documents.iter().map(|document| async move {
        let payload = serde_json::to_vec(document).expect("documents serialise");
        retry_publish(retry, "ingest", topic, || bus.publish_document(&document.id, Some(&payload))).await
    }))
    .buffer_unordered(DOCUMENTS_IN_FLIGHT);
    published.try_collect::<Vec<()>>().await?;
    Ok(())
}
