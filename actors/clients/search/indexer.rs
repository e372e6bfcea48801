//! `lacuna indexer`: a Meilisearch index as a copy of the `documents` topic. One indexer serves every
//! retrieve replica, since they all search the same server. It reads every partition, gathers changes
//! for up to `search.commit_interval_ms` (or `search.meilisearch.batch_size` changes), keeps each
//! document's latest valid change, applies the batch and waits for Meilisearch's tasks
//! (`meili/write.rs`), and only then stores the offsets it applied beside the index. So:
//! - a restart resumes from the stored offsets, and a batch applied twice changes nothing;
//! - an empty server (a new volume, a new index uid) is filled from the start of the topic, and so is
//!   one whose offsets are another topic's, or older than what the topic still keeps;
//! - it is ready once it has applied every record the topic held when it started;
//! - a Meilisearch or broker outage, or one not up yet when the indexer starts, is waited out with
//!   backoff; nothing is skipped.
//!
//! A record that is not a document goes to the dead letters, as a replica's materialiser sends it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::changes::{
    Applied, DeadLetters, Start, dead_letters, identity, now_ms, read_change, report_lag, resume, retention_to_resume,
};
use super::materialiser::LAG_EVERY;
use super::meili::{Update, topic_seq};
use super::{MeiliSearch, SearchError};
use crate::actors::clients::backoff;
use crate::config::SearchSettings;
use crate::metrics::METRICS;
use crate::topics::kafka::{Change, Changelog, KafkaBus, TopicIdentity};

/// The longest wait between two tries of a batch Meilisearch could not take.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub struct Indexer {
    meili: MeiliSearch,
    bus: Arc<KafkaBus>,
    changelog: Arc<Changelog>,
    rejected: DeadLetters,
    passage_words: usize,
    interval: Duration,
    batch_size: usize,
    max_batch_bytes: usize,
}

impl Indexer {
    /// Must be called within a tokio runtime: a task of it publishes the dead letters.
    pub fn new(meili: MeiliSearch, bus: &Arc<KafkaBus>, settings: &SearchSettings) -> Result<Indexer, SearchError> {
        let changelog = bus.changelog().map_err(|e| SearchError::Index(e.to_string()))?;
        Ok(Indexer {
            meili,
            bus: bus.clone(),
            changelog: Arc::new(changelog),
            rejected: dead_letters(bus),
            passage_words: settings.passage_words,
            interval: Duration::from_millis(settings.commit_interval_ms.max(1)),
            batch_size: settings.meilisearch.batch_size.max(1),
            max_batch_bytes: settings.meilisearch.max_batch_bytes.max(1),
        })
    }

    /// Follows the topic for good; `ready` turns true once caught up. Ends only on an error no retry
    /// cures (a task Meilisearch refuses, an index keyed otherwise), for the process to end with it.
    pub async fn run(self, ready: Arc<AtomicBool>) -> Result<(), SearchError> {
        let topic = self.changelog.topic().to_string();
        // A broker or a server not up yet (pods start in any order) is waited for, as an outage is.
        let spans = patiently("reading the topic's partitions", || {
            let changelog = self.changelog.clone();
            blocking(move || changelog.spans())
        })
        .await?;
        // Read once: `resume` below is tried again while Meilisearch is away.
        let retention = self.bus.tombstone_retention().await;
        let (bus, name) = (self.bus.clone(), topic.clone());
        let identity = tokio::task::spawn_blocking(move || identity(&bus, &name)).await.ok().flatten();
        let (mut applied, tombstones_kept) = patiently("opening the Meilisearch index", || {
            self.resume((&topic, identity.as_ref()), &spans, retention.clone())
        })
        .await?;
        let Start { from, mut behind } = applied.start(&spans);
        let changelog = self.changelog.clone();
        blocking(move || changelog.start(&from)).await?;
        tracing::info!(
            topic,
            partitions = spans.len(),
            behind = behind.len(),
            "indexing the documents topic into Meilisearch"
        );
        let mut ends: HashMap<i32, i64> = spans.iter().map(|s| (s.partition, s.high)).collect();
        // When `ends` were read: holding everything up to them, the index was caught up then.
        let mut ends_at = now_ms();
        let mut last_lag = Instant::now();
        loop {
            let changelog = self.changelog.clone();
            let (interval, batch_size, max_bytes) = (self.interval, self.batch_size, self.max_batch_bytes);
            let changes = blocking(move || Ok(gather(&changelog, interval, batch_size, max_bytes))).await?;
            if !changes.is_empty() {
                let updates = self.latest(&changes);
                for change in &changes {
                    applied.advance(change, &mut behind);
                }
                applied.note_caught_up(&ends, ends_at);
                self.apply(&updates, &applied).await?;
            }
            if behind.is_empty() && !ready.swap(true, Ordering::Relaxed) {
                tracing::info!("the Meilisearch index caught up with the documents topic");
            }
            if last_lag.elapsed() >= LAG_EVERY {
                let reading = now_ms();
                let all;
                (ends, all) = self.ends(ends).await;
                if all {
                    ends_at = reading;
                }
                if applied.heartbeat_due(&ends, ends_at, tombstones_kept) {
                    applied.note_caught_up(&ends, ends_at);
                    patiently("storing the applied offsets", || self.meili.store_applied(&applied)).await?;
                }
                if let Ok(passages) = self.meili.documents().await {
                    METRICS.index_passages.with_label_values::<&str>(&[]).set(passages as i64);
                }
                last_lag = Instant::now();
            }
            report_lag(&applied, &ends);
        }
    }

    /// Opens the index for writing, and the offsets to resume from ([`resume`]; an index to rebuild
    /// is emptied first), with the tombstones' retention to go by ([`retention_to_resume`]).
    async fn resume(
        &self,
        (topic, identity): (&str, Option<&TopicIdentity>),
        spans: &[crate::topics::kafka::Span],
        retention: Result<Duration, String>,
    ) -> Result<(Applied, Duration), SearchError> {
        self.meili.open_for_writing().await?;
        let mut stored = self.meili.applied().await?;
        if self.meili.clock_numbered().await? {
            // Numbered by a clock, its entries would outrank every offset: they must go first.
            let Some(applied) = stored.take() else {
                return Err(SearchError::Refused(format!(
                    "Meilisearch index {:?} holds changes numbered by a clock (`lacuna ingest` or serve wrote it in \
                     process): an indexer numbers the topic's changes by offset, which those would outrank. Give \
                     search.meilisearch.index a new uid for the indexer (or delete this index) and start it again",
                    self.meili.settings.index
                )));
            };
            tracing::warn!(stored = ?applied.next, "the index's changes are numbered by the clock of an indexer before this build: rebuilding it from the topic, numbered by offset");
            self.meili.clear().await?;
        }
        let tombstones_kept = retention_to_resume(retention, stored.as_ref()).map_err(SearchError::Refused)?;
        let (applied, clear) = resume(stored, (topic, identity), spans, tombstones_kept, now_ms());
        if clear {
            self.meili.clear().await?;
        }
        Ok((applied, tombstones_kept))
    }

    /// Each document's last valid change of the batch, numbered by its offset ([`topic_seq`]); the
    /// others are dead letters.
    fn latest(&self, changes: &[Change]) -> Vec<(u64, Update)> {
        let mut latest: Vec<(u64, Update)> = Vec::new();
        let mut position: HashMap<String, usize> = HashMap::new();
        for change in changes {
            let document = match read_change(change) {
                Ok(document) => document,
                Err(letter) => {
                    self.rejected.send(letter);
                    continue;
                }
            };
            let update = (topic_seq(change.offset), Update { doc_id: change.key.clone(), document });
            match position.get(&change.key) {
                Some(&at) => latest[at] = update,
                None => {
                    position.insert(change.key.clone(), latest.len());
                    latest.push(update);
                }
            }
        }
        latest
    }

    /// Applies a batch and stores the offsets after it, trying again with backoff while Meilisearch
    /// fails in a way a retry may cure.
    async fn apply(&self, updates: &[(u64, Update)], applied: &Applied) -> Result<(), SearchError> {
        // Offsets only grow, so the offsets after this batch tag its passages apart from every
        // earlier batch's, and the same batch applied again gets the same tag.
        let change: String = applied.next.iter().map(|(p, o)| format!("{p}-{o}")).collect::<Vec<_>>().join("_");
        let started = Instant::now();
        let written = patiently("applying a batch", || async {
            let written = self.meili.apply_at(updates, self.passage_words, &change).await?;
            self.meili.store_applied(applied).await?;
            Ok(written)
        })
        .await?;
        METRICS.index_changes.with_label_values(&["upsert"]).inc_by(written.upserts as u64);
        METRICS.index_changes.with_label_values(&["delete"]).inc_by(written.deletes as u64);
        METRICS.index_commit_seconds.with_label_values::<&str>(&[]).observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// The partitions' ends now, for the lag metric and the catch-up time, and whether the broker
    /// answered for every one (those it did not keep their old end).
    async fn ends(&self, mut ends: HashMap<i32, i64>) -> (HashMap<i32, i64>, bool) {
        let changelog = self.changelog.clone();
        blocking(move || {
            let all = changelog.refresh_ends(&mut ends);
            Ok((ends, all))
        })
        .await
        .unwrap_or_default()
    }
}

/// Tries `work` until it succeeds or fails in a way no retry cures (a task Meilisearch refuses, an
/// index keyed otherwise), waiting longer each time, up to [`MAX_BACKOFF`].
async fn patiently<T, F, Fut>(what: &str, mut work: F) -> Result<T, SearchError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, SearchError>>,
{
    let mut attempt = 0;
    loop {
        match work().await {
            Err(error) if error.is_transient() => {
                attempt += 1;
                let wait = backoff(500, attempt).min(MAX_BACKOFF);
                tracing::warn!(%error, attempt, wait_ms = wait.as_millis() as u64, "{what} failed: trying again");
                tokio::time::sleep(wait).await;
            }
            outcome => return outcome,
        }
    }
}

/// The changes read for `interval`, or until there are `limit` of them or they hold `max_bytes` of
/// documents (none when none came): what is held between reading and uploading stays bounded when
/// catching up on large documents. A broker away is waited out: librdkafka reconnects.
fn gather(changelog: &Changelog, interval: Duration, limit: usize, max_bytes: usize) -> Vec<Change> {
    let (mut changes, mut bytes) = (Vec::new(), 0);
    let started = Instant::now();
    while changes.len() < limit && bytes < max_bytes && started.elapsed() < interval {
        match changelog.poll(Duration::from_millis(50)) {
            Ok(Some(change)) => {
                bytes += change.document.as_ref().map_or(0, Vec::len);
                changes.push(change);
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, "reading the documents topic failed: retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    changes
}

/// The changelog reader blocks: its calls run on tokio's blocking threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, crate::topics::BusError> + Send + 'static,
) -> Result<T, SearchError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| SearchError::Index(e.to_string()))?
        .map_err(|e| SearchError::Index(e.to_string()))
}
