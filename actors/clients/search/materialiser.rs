//! A retrieve replica's local tantivy index as a copy of the `documents` topic (`search.follow_documents`):
//! the Kafka pattern of a table that every instance reads whole. Each replica reads every partition,
//! applies each document through the same [`TantivyWriter`] as `lacuna ingest`, and commits every
//! `search.commit_interval_ms`, storing the offsets it applied inside that same commit. So the
//! folder is a cache of the topic:
//! - a restart resumes from the offsets of its last commit, which name exactly what the index holds;
//! - a missing folder, one tantivy cannot open, or one whose offsets are older than what the topic
//!   still keeps (retention or compaction removed records, tombstones among them, that it never
//!   saw) is rebuilt from the start of the topic;
//! - the replica is ready once it has applied and committed every record the topic held when it
//!   started ([`Following::caught_up`]).
//!
//! A record that is not a valid document is logged, counted (`lacuna_index_changes_total{change=
//! "rejected"}`), skipped, and written to the dead letters' topic `<kafka.topic_prefix>documents-dead-
//! letters` with why (`RejectedDocument`): `lacuna ingest` and `serve` check documents before publishing,
//! so such a record came from another producer, who can read there what to mend.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::changes::{
    Applied, DeadLetters, Start, dead_letters, identity, now_ms, read_change, rejected, report_lag, resume,
    retention_to_resume,
};
use super::{SearchError, TantivyWriter};
use crate::config::SearchSettings;
use crate::metrics::METRICS;
use crate::topics::kafka::{Change, Changelog, KafkaBus, RejectedDocument};

/// How often the lag metric asks the broker for the topic's end.
pub(super) const LAG_EVERY: Duration = Duration::from_secs(5);

/// Where a materialiser stands, for readiness and for the stage that waits on it.
#[derive(Clone, Debug, PartialEq)]
pub enum Following {
    CatchingUp,
    /// Every record the topic held at start is applied and committed.
    CaughtUp,
    /// It stopped; the process should end so that it is restarted (it resumes from its last commit).
    Failed(String),
}

/// A running materialiser: its state, and a stop flag its thread checks between records.
pub struct Materialiser {
    pub state: watch::Receiver<Following>,
    stop: Arc<AtomicBool>,
}

impl Materialiser {
    /// Starts following the documents topic into the index at `settings.index_dir`, on a thread of
    /// its own (tantivy and the changelog reader block). Must be called within a tokio runtime: a task
    /// of it publishes the dead letters.
    pub fn start(bus: &Arc<KafkaBus>, settings: &SearchSettings) -> Result<Materialiser, SearchError> {
        let changelog = bus.changelog().map_err(|e| SearchError::Index(e.to_string()))?;
        let (sender, state) = watch::channel(Following::CatchingUp);
        let stop = Arc::new(AtomicBool::new(false));
        let follower = Follower {
            bus: bus.clone(),
            changelog,
            dir: settings.index_dir.clone(),
            passage_words: settings.passage_words,
            interval: Duration::from_millis(settings.commit_interval_ms.max(1)),
            stop: stop.clone(),
            rejected: dead_letters(bus),
        };
        std::thread::Builder::new()
            .name("materialiser".into())
            .spawn(move || {
                if let Err(error) = follower.run(&sender) {
                    tracing::error!(%error, "the index stopped following the documents topic");
                    sender.send_replace(Following::Failed(error.to_string()));
                }
            })
            .map_err(|e| SearchError::Index(e.to_string()))?;
        Ok(Materialiser { state, stop })
    }

    /// Waits until caught up; the error when it failed first.
    pub async fn caught_up(&mut self) -> Result<(), String> {
        let state = self.state.wait_for(|s| *s != Following::CatchingUp).await.map_err(|e| e.to_string())?;
        match &*state {
            Following::Failed(reason) => Err(reason.clone()),
            _ => Ok(()),
        }
    }

    /// Resolves when the materialiser fails, with why.
    pub async fn failed(&mut self) -> String {
        match self.state.wait_for(|s| matches!(s, Following::Failed(_))).await {
            Ok(state) => match &*state {
                Following::Failed(reason) => reason.clone(),
                _ => unreachable!("waited for a failure"),
            },
            Err(_) => "the materialiser thread ended".into(),
        }
    }
}

impl Drop for Materialiser {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Follower {
    bus: Arc<KafkaBus>,
    changelog: Changelog,
    dir: PathBuf,
    passage_words: usize,
    interval: Duration,
    stop: Arc<AtomicBool>,
    /// Records that are not documents, for the dead letters' topic.
    rejected: DeadLetters,
}

impl Follower {
    fn run(self, state: &watch::Sender<Following>) -> Result<(), SearchError> {
        let bus_error = |e: crate::topics::BusError| SearchError::Index(e.to_string());
        let topic = self.changelog.topic().to_string();
        let spans = self.changelog.spans().map_err(bus_error)?;
        let mut writer = open_or_recreate(&self.dir)?;
        let stored: Option<Applied> = writer.payload()?.and_then(|p| serde_json::from_str(&p).ok());
        // Read here, on the follower's thread: the admin client's future needs no runtime.
        let retention = futures::executor::block_on(self.bus.tombstone_retention());
        let tombstones_kept = retention_to_resume(retention, stored.as_ref()).map_err(SearchError::Refused)?;
        let identity = identity(&self.bus, &topic);
        let (mut applied, clear) = resume(stored, (&topic, identity.as_ref()), &spans, tombstones_kept, now_ms());
        if clear {
            tracing::warn!(dir = %self.dir.display(), "emptying the local index to rebuild it from the topic");
            writer.clear()?;
        }
        // The end offsets to reach before the replica is ready.
        let Start { from, mut behind } = applied.start(&spans);
        self.changelog.start(&from).map_err(bus_error)?;
        tracing::info!(topic, partitions = spans.len(), behind = behind.len(), "following the documents topic");
        let mut ends: HashMap<i32, i64> = spans.iter().map(|s| (s.partition, s.high)).collect();
        // When `ends` were read: holding everything up to them, the index was caught up then.
        let mut ends_at = now_ms();
        let (mut dirty, mut last_commit, mut last_lag) = (true, Instant::now(), Instant::now());
        let mut announced = false;
        while !self.stop.load(Ordering::Relaxed) {
            // A broker away for a while is not the index's failure: the replica keeps searching what
            // it has, and librdkafka reconnects.
            let polled = self.changelog.poll(Duration::from_millis(50)).unwrap_or_else(|error| {
                tracing::warn!(%error, "reading the documents topic failed: retrying");
                std::thread::sleep(Duration::from_millis(500));
                None
            });
            if let Some(change) = polled {
                if let Err(letter) = apply(&mut writer, &change, self.passage_words) {
                    self.rejected.send(letter);
                }
                applied.advance(&change, &mut behind);
                dirty = true;
            }
            let caught_up_now = !announced && behind.is_empty();
            if dirty && (caught_up_now || last_commit.elapsed() >= self.interval) {
                applied.note_caught_up(&ends, ends_at);
                commit(&mut writer, &applied, &ends)?;
                (dirty, last_commit) = (false, Instant::now());
            }
            if caught_up_now {
                announced = true;
                state.send_replace(Following::CaughtUp);
                tracing::info!(passages = writer.passages(), "the index caught up with the documents topic");
            }
            if last_lag.elapsed() >= LAG_EVERY {
                let reading = now_ms();
                if self.changelog.refresh_ends(&mut ends) {
                    ends_at = reading;
                }
                dirty |= applied.heartbeat_due(&ends, ends_at, tombstones_kept);
                report_lag(&applied, &ends);
                last_lag = Instant::now();
            }
        }
        if dirty {
            applied.note_caught_up(&ends, ends_at);
            commit(&mut writer, &applied, &ends)?;
        }
        Ok(())
    }
}

/// The writer of `dir`; a folder tantivy cannot open (damaged, half-written) is moved aside and
/// started again empty, to be filled from the topic. A folder another process writes is an error.
fn open_or_recreate(dir: &Path) -> Result<TantivyWriter, SearchError> {
    match TantivyWriter::open(dir) {
        Ok(writer) => Ok(writer),
        Err(error) if error.to_string().contains("being written by another process") => Err(error),
        Err(error) => {
            tracing::warn!(%error, dir = %dir.display(), "cannot open the local index: rebuilding it from the topic");
            let aside = dir.with_extension(format!("damaged-{}", std::process::id()));
            std::fs::rename(dir, &aside).map_err(|e| SearchError::Index(format!("{}: {e}", dir.display())))?;
            let _ = std::fs::remove_dir_all(&aside);
            TantivyWriter::open(dir)
        }
    }
}

/// Applies one record; one that is not a document comes back as its dead letter.
fn apply(writer: &mut TantivyWriter, change: &Change, passage_words: usize) -> Result<(), RejectedDocument> {
    match read_change(change)? {
        None => {
            writer.delete(&change.key);
            METRICS.index_changes.with_label_values(&["delete"]).inc();
        }
        Some(document) => {
            writer.upsert(&document, passage_words).map_err(|e| rejected(change, e.to_string()))?;
            METRICS.index_changes.with_label_values(&["upsert"]).inc();
        }
    }
    Ok(())
}

fn commit(writer: &mut TantivyWriter, applied: &Applied, ends: &HashMap<i32, i64>) -> Result<(), SearchError> {
    let started = Instant::now();
    let payload = serde_json::to_string(applied).expect("offsets serialise");
    writer.commit_with(&payload)?;
    METRICS.index_commit_seconds.with_label_values::<&str>(&[]).observe(started.elapsed().as_secs_f64());
    METRICS.index_passages.with_label_values::<&str>(&[]).set(writer.passages() as i64);
    report_lag(applied, ends);
    Ok(())
}
