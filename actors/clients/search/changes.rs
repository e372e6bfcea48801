//! What both followers of the documents topic share: the tantivy materialiser of each retrieve
//! replica (`materialiser.rs`) and the Meilisearch indexer (`indexer.rs`). The offsets an index
//! applied, where to start reading, how a record becomes a document or a dead letter, and the lag
//! metrics.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::documents::Document;
use crate::metrics::METRICS;
use crate::topics::kafka::{Change, KafkaBus, RejectedDocument, Span, TopicIdentity};

/// Dead letters waiting for the producer; beyond this many, more are only logged and counted.
const REJECTED_QUEUE: usize = 1024;

/// Stored with what an index holds: the topic, per partition the next offset to apply, and when it
/// last held everything the topic had.
#[derive(Serialize, Deserialize, Default, PartialEq, Debug, Clone)]
pub struct Applied {
    pub topic: String,
    pub next: BTreeMap<i32, i64>,
    /// When the index last held every record the topic had then, in ms since the epoch: every record
    /// it has not applied was written after it. Compaction removes a tombstone once it is older than
    /// the topic's `delete.retention.ms`, so a follower caught up longer ago than that may have
    /// missed deletions, though its offsets are still within the log. `None`: never caught up (or
    /// stored by a build before this one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caught_up_at_ms: Option<u64>,
    /// The cluster's and the topic's ids, where the broker gave them: offsets of a topic deleted
    /// and created again under the same name are not this one's. `None`: not known (stored by a
    /// build before this one, or a broker that gives none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<TopicIdentity>,
}

/// Where a follower starts reading each partition, and the end offsets it must reach before it is
/// caught up (partitions it starts at their end are not waited for).
pub struct Start {
    pub from: HashMap<i32, i64>,
    pub behind: HashMap<i32, i64>,
}

impl Applied {
    fn fresh(topic: &str) -> Applied {
        Applied { topic: topic.to_string(), ..Default::default() }
    }

    /// Whether it last caught up longer ago than the topic keeps tombstones.
    fn stale(&self, tombstones_kept: Duration, now_ms: u64) -> bool {
        self.caught_up_at_ms.is_some_and(|at| now_ms.saturating_sub(at) >= tombstones_kept.as_millis() as u64)
    }

    /// Whether an index caught up at `ends` (read at `read_at_ms`) and idle should store its offsets
    /// again, to keep its catch-up time recent: a quarter of the tombstones' retention after the last.
    pub fn heartbeat_due(&self, ends: &HashMap<i32, i64>, read_at_ms: u64, tombstones_kept: Duration) -> bool {
        let since = read_at_ms.saturating_sub(self.caught_up_at_ms.unwrap_or(0));
        self.holds(ends) && since >= tombstones_kept.as_millis() as u64 / 4
    }

    /// Notes that the index holds every record up to `ends`, the partitions' ends as read at
    /// `read_at_ms`, when it does.
    pub fn note_caught_up(&mut self, ends: &HashMap<i32, i64>, read_at_ms: u64) {
        if self.holds(ends) {
            self.caught_up_at_ms = Some(read_at_ms);
        }
    }

    /// Whether every partition is applied up to its end in `ends`.
    fn holds(&self, ends: &HashMap<i32, i64>) -> bool {
        ends.iter().all(|(partition, end)| self.next.get(partition).is_some_and(|next| next >= end))
    }

    /// Where to read from, each partition's stored offset or its earliest record; `next` then
    /// names every partition.
    pub fn start(&mut self, spans: &[Span]) -> Start {
        let from: HashMap<i32, i64> = spans
            .iter()
            .map(|s| (s.partition, self.next.get(&s.partition).copied().unwrap_or(s.low).max(s.low)))
            .collect();
        let behind = spans.iter().filter(|s| from[&s.partition] < s.high).map(|s| (s.partition, s.high)).collect();
        for (&partition, &offset) in &from {
            self.next.insert(partition, offset);
        }
        Start { from, behind }
    }

    /// Records that `change` was applied (or skipped as a dead letter), and whether that reached
    /// its partition's end in `behind`.
    pub fn advance(&mut self, change: &Change, behind: &mut HashMap<i32, i64>) {
        self.next.insert(change.partition, change.offset + 1);
        if behind.get(&change.partition).is_some_and(|end| change.offset + 1 >= *end) {
            behind.remove(&change.partition);
        }
    }
}

/// Where a follower resumes, given the offsets stored with its index, how long the topic keeps
/// tombstones, and the time now (ms since the epoch): those offsets when they still hold, else none,
/// and `true` when the index must be emptied first. It must when it holds what another topic's
/// records put there, or records since lost to retention or compaction, or when it last caught up
/// longer ago than the topic keeps tombstones (deletions since may be gone unseen). With nothing
/// stored, what the index holds (a corpus from `lacuna index`) stays, and the topic's documents go
/// on top of it. An index that never caught up resumes: a first catch-up that a crash interrupts
/// must not start over each time.
pub fn resume(
    stored: Option<Applied>,
    (topic, identity): (&str, Option<&TopicIdentity>),
    spans: &[Span],
    tombstones_kept: Duration,
    now_ms: u64,
) -> (Applied, bool) {
    let fresh = Applied { identity: identity.cloned(), ..Applied::fresh(topic) };
    let Some(stored) = stored else { return (fresh, false) };
    let recreated = identity.is_some_and(|now| stored.identity.as_ref().is_some_and(|kept| kept != now));
    let why = if recreated {
        "the index's offsets are of a topic of this name since deleted and created again, or of another cluster"
    } else if stored.topic != topic || outdated(&stored, spans) {
        "the index's offsets are not the topic's, or older than its earliest records, or past its end"
    } else if stored.stale(tombstones_kept, now_ms)
        && spans.iter().any(|s| stored.next.get(&s.partition) < Some(&s.high))
    {
        "the index last caught up longer ago than the topic keeps tombstones (delete.retention.ms): \
         deletions since may be gone unseen"
    } else {
        // Offsets stored without an identity (an older build) are taken as this topic's, and kept with it.
        let identity = identity.cloned().or(stored.identity.clone());
        return (Applied { identity, ..stored }, false);
    };
    tracing::warn!(
        stored = ?stored.next, caught_up_at_ms = ?stored.caught_up_at_ms, tombstones_kept_ms = tombstones_kept.as_millis() as u64,
        topic, "{why}: rebuilding from the topic"
    );
    (fresh, true)
}

/// The tombstone retention a follower goes by, given the one the broker gave (or why not) and the
/// offsets stored with its index. Unknown, a follower with offsets stored cannot tell whether it was
/// away long enough to miss deletions: it refuses to resume, with why. One with none stored reads
/// the topic from its start and misses nothing; Kafka's default, a day, then only paces its
/// heartbeat.
pub fn retention_to_resume(read: Result<Duration, String>, stored: Option<&Applied>) -> Result<Duration, String> {
    const KAFKA_DEFAULT: Duration = Duration::from_secs(24 * 3600);
    match read {
        Ok(kept) => Ok(kept),
        Err(why) if stored.is_some_and(|s| !s.next.is_empty()) => {
            Err(format!("refusing to resume from the index's stored offsets: {why}"))
        }
        Err(why) => {
            tracing::warn!(%why, "reading the documents topic from its start; a restart will need the tombstones' retention");
            Ok(KAFKA_DEFAULT)
        }
    }
}

/// The identity of the topic `name`, or `None` (logged) where it cannot be read: a recreated topic
/// is then noticed by its offsets alone. Blocks for up to 10 s.
pub fn identity(bus: &KafkaBus, name: &str) -> Option<TopicIdentity> {
    bus.identify_blocking(name)
        .inspect_err(|error| tracing::warn!(%error, topic = name, "cannot read the topic's identity: a topic created again is noticed only by its offsets"))
        .ok()
}

/// Milliseconds since the epoch, as `Applied::caught_up_at_ms` counts them.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// A stored offset below a partition's earliest record (records it never saw are gone), or past its
/// end (the offsets are another topic's of the same name: one deleted and created again, or another
/// cluster's).
fn outdated(applied: &Applied, spans: &[Span]) -> bool {
    spans.iter().any(|s| {
        let next = applied.next.get(&s.partition).copied();
        next.unwrap_or(0) < s.low || next.is_some_and(|next| next > s.high)
    })
}

/// A record as a document (`None` for a tombstone), or as its dead letter when it is not one.
pub fn read_change(change: &Change) -> Result<Option<Document>, RejectedDocument> {
    parse_change(change).map_err(|error| rejected(change, error))
}

/// A record as a document (`None` for a tombstone), or why it is not one.
pub fn parse_change(change: &Change) -> Result<Option<Document>, String> {
    let Some(payload) = &change.document else { return Ok(None) };
    serde_json::from_slice::<Document>(payload)
        .map_err(|e| e.to_string())
        .and_then(|d| d.check(usize::MAX).map(|_| d).map_err(|e| e.to_string()))
        .and_then(|d| if d.id == change.key { Ok(Some(d)) } else { Err(format!("its id {:?} is not its key", d.id)) })
}

/// The dead letter of a record that could not be applied, logged and counted.
pub fn rejected(change: &Change, error: String) -> RejectedDocument {
    tracing::error!(
        key = change.key, partition = change.partition, offset = change.offset, %error,
        "a documents record is not a document: skipped, and sent to the dead letters"
    );
    METRICS.index_changes.with_label_values(&["rejected"]).inc();
    RejectedDocument {
        partition: change.partition,
        offset: change.offset,
        key: change.key.clone(),
        error,
        payload: String::from_utf8_lossy(change.document.as_deref().unwrap_or_default()).into_owned(),
    }
}

/// Where a follower sends its dead letters: a task publishes them to the dead letters' topic, one
/// at a time, so that a slow broker never holds the index back. Must be called within a tokio runtime.
pub fn dead_letters(bus: &Arc<KafkaBus>) -> DeadLetters {
    let (sender, mut queue) = tokio::sync::mpsc::channel::<RejectedDocument>(REJECTED_QUEUE);
    let publisher = bus.clone();
    tokio::spawn(async move {
        while let Some(letter) = queue.recv().await {
            if let Err(error) = publisher.publish_rejected_document(&letter).await {
                tracing::error!(%error, key = letter.key, offset = letter.offset, "cannot publish the dead letter of a record that is not a document");
            }
        }
    });
    DeadLetters(sender)
}

pub struct DeadLetters(tokio::sync::mpsc::Sender<RejectedDocument>);

impl DeadLetters {
    /// Queues a dead letter; when too many wait, it is only logged.
    pub fn send(&self, letter: RejectedDocument) {
        let (partition, offset) = (letter.partition, letter.offset);
        if self.0.try_send(letter).is_err() {
            tracing::error!(partition, offset, "too many dead letters waiting: this one is only logged");
        }
    }
}

/// The applied offset and the lag behind `ends` of every partition, as metrics.
pub fn report_lag(applied: &Applied, ends: &HashMap<i32, i64>) {
    for (partition, next) in &applied.next {
        let label = partition.to_string();
        METRICS.index_applied_offset.with_label_values(&[&label]).set(*next);
        let end = ends.get(partition).copied().unwrap_or(*next);
        METRICS.index_lag.with_label_values(&[&label]).set((end - next).max(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(partition: i32, low: i64, high: i64) -> Span {
        Span { partition, low, high }
    }

    #[test]
    fn stored_offsets_below_a_partitions_earliest_record_are_outdated() {
        let applied = Applied {
            topic: "t".into(),
            next: BTreeMap::from([(0, 10), (1, 3)]),
            caught_up_at_ms: None,
            identity: None,
        };
        assert!(!outdated(&applied, &[span(0, 0, 12), span(1, 3, 3)]), "3 is partition 1's earliest: nothing missed");
        assert!(outdated(&applied, &[span(0, 0, 12), span(1, 4, 9)]), "offset 3 of partition 1 is gone unseen");
        assert!(outdated(&applied, &[span(0, 0, 12), span(2, 1, 5)]), "a partition it never read lost its start");
        assert!(!outdated(&applied, &[span(2, 0, 5)]), "a new partition read from its start");
        let resume =
            |stored: Option<Applied>, topic: &str, spans: &[Span]| resume(stored, (topic, None), spans, DAY, NOW);
        let fresh = Applied::fresh("t");
        assert_eq!(resume(None, "t", &[span(0, 0, 12)]), (fresh.clone(), false), "nothing stored: keep what is there");
        assert_eq!(resume(Some(applied.clone()), "t", &[span(0, 0, 12)]), (applied.clone(), false));
        assert_eq!(
            resume(Some(applied), "other", &[span(0, 0, 12)]),
            (Applied::fresh("other"), true),
            "another topic's"
        );
    }

    /// Offsets past a partition's end were not this topic's: it was deleted and created again, or
    /// the follower now reads another cluster. Resuming there would skip the new topic's records, and
    /// the follower would call itself caught up at once (issue 57, item 2).
    #[test]
    fn stored_offsets_past_a_partitions_end_are_outdated() {
        let applied =
            Applied { topic: "t".into(), next: BTreeMap::from([(0, 10)]), caught_up_at_ms: None, identity: None };
        assert!(!outdated(&applied, &[span(0, 0, 10)]), "at the end: caught up, nothing missed");
        assert!(outdated(&applied, &[span(0, 0, 4)]), "offset 10 of a partition that ends at 4");
        assert_eq!(
            resume(Some(applied), ("t", None), &[span(0, 0, 4)], DAY, NOW).1,
            true,
            "rebuilt from the topic's start"
        );
    }

    /// A topic deleted and created again can grow past the offsets an index stored before its
    /// offsets say anything is wrong; its id tells at once (issue 75, item 2). Offsets stored by an
    /// older build, without an id, are kept and take this topic's.
    #[test]
    fn stored_offsets_of_a_topic_since_created_again_are_not_resumed() {
        let identity = |topic_id: &str| TopicIdentity { cluster: "c".into(), topic_id: topic_id.into() };
        let (old, new) = (identity("01"), identity("02"));
        let applied = Applied {
            topic: "t".into(),
            next: BTreeMap::from([(0, 3)]),
            caught_up_at_ms: None,
            identity: Some(old.clone()),
        };
        let spans = [span(0, 0, 12)];
        assert_eq!(resume(Some(applied.clone()), ("t", Some(&old)), &spans, DAY, NOW), (applied.clone(), false));
        let (rebuilt, clear) = resume(Some(applied.clone()), ("t", Some(&new)), &spans, DAY, NOW);
        assert!(clear, "a recreated topic grown past the stored offsets is rebuilt");
        assert_eq!(rebuilt, Applied { identity: Some(new.clone()), ..Applied::fresh("t") });
        let older = Applied { identity: None, ..applied.clone() };
        assert_eq!(
            resume(Some(older), ("t", Some(&new)), &spans, DAY, NOW),
            (Applied { identity: Some(new), ..applied.clone() }, false)
        );
        assert_eq!(
            resume(Some(applied.clone()), ("t", None), &spans, DAY, NOW),
            (applied, false),
            "no id read: offsets decide"
        );
    }

    const DAY: Duration = Duration::from_secs(24 * 3600);
    const NOW: u64 = 1_800_000_000_000;

    /// Compaction removes tombstones older than the topic's `delete.retention.ms`: a follower that last
    /// caught up longer ago may have missed deletions, though its offsets are within the log (issue
    /// 57, item 2).
    #[test]
    fn a_follower_caught_up_longer_ago_than_tombstones_are_kept_is_rebuilt() {
        let mut applied = Applied {
            topic: "t".into(),
            next: BTreeMap::from([(0, 10), (1, 4)]),
            caught_up_at_ms: None,
            identity: None,
        };
        applied.note_caught_up(&HashMap::from([(0, 12), (1, 4)]), NOW - 5);
        assert_eq!(applied.caught_up_at_ms, None, "partition 0 is behind its end");
        applied.note_caught_up(&HashMap::from([(0, 10), (1, 4)]), NOW - 5);
        assert_eq!(applied.caught_up_at_ms, Some(NOW - 5));
        let spans = [span(0, 0, 12), span(1, 0, 4)];
        let hour = Duration::from_secs(3600);
        assert!(!resume(Some(applied.clone()), ("t", None), &spans, hour, NOW).1, "back within the hour");
        let away = Applied { caught_up_at_ms: Some(NOW - 2 * 3_600_000), ..applied.clone() };
        assert_eq!(
            resume(Some(away.clone()), ("t", None), &spans, hour, NOW),
            (Applied::fresh("t"), true),
            "away two hours"
        );
        let quiet = [span(0, 0, 10), span(1, 0, 4)];
        assert!(!resume(Some(away.clone()), ("t", None), &quiet, hour, NOW).1, "no record since: no deletion missed");
        assert!(away.heartbeat_due(&HashMap::from([(0, 10), (1, 4)]), NOW, hour), "idle and caught up: stored again");
        assert!(!applied.heartbeat_due(&HashMap::from([(0, 10), (1, 4)]), NOW, hour), "stored 5 ms ago");
        assert!(!away.heartbeat_due(&HashMap::from([(0, 11), (1, 4)]), NOW, hour), "not caught up");
        let never = Applied { caught_up_at_ms: None, ..applied };
        assert!(!resume(Some(never), ("t", None), &spans, hour, NOW).1, "a first catch-up goes on where it stopped");
    }

    #[test]
    fn a_follower_starts_at_its_stored_offsets_and_waits_only_for_partitions_behind() {
        let mut applied =
            Applied { topic: "t".into(), next: BTreeMap::from([(0, 10)]), caught_up_at_ms: None, identity: None };
        let mut start = applied.start(&[span(0, 0, 12), span(1, 2, 2), span(2, 4, 9)]);
        assert_eq!(start.from, HashMap::from([(0, 10), (1, 2), (2, 4)]));
        assert_eq!(start.behind, HashMap::from([(0, 12), (2, 9)]), "partition 1 is empty from where it starts");
        let change = |partition, offset| Change { partition, offset, key: "k".into(), document: None };
        applied.advance(&change(0, 10), &mut start.behind);
        assert!(start.behind.contains_key(&0));
        applied.advance(&change(0, 11), &mut start.behind);
        assert_eq!(start.behind, HashMap::from([(2, 9)]));
        assert_eq!(applied.next, BTreeMap::from([(0, 12), (1, 2), (2, 4)]));
    }

    #[test]
    fn a_record_whose_id_is_not_its_key_is_a_dead_letter() {
        let change = |key: &str, payload: &str| Change {
            partition: 0,
            offset: 7,
            key: key.into(),
            document: Some(payload.as_bytes().to_vec()),
        };
        let good = r#"{"id": "a", "text": "x"}"#;
        assert_eq!(read_change(&change("a", good)).unwrap().unwrap().id, "a");
        let letter = read_change(&change("b", good)).unwrap_err();
        assert!(letter.error.contains("not its key") && letter.payload == good && letter.offset == 7, "{letter:?}");
        assert!(read_change(&change("a", "{not json")).is_err());
        let tombstone = Change { partition: 0, offset: 8, key: "a".into(), document: None };
        assert_eq!(read_change(&tombstone).unwrap(), None);
    }
}
