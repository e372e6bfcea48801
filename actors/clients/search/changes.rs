//! What both followers of the documents topic share: the tantivy materialiser of each retrieve
//! replica (`materialiser.rs`) and the Meilisearch indexer (`indexer.rs`). The offsets an index
//! applied, where to start reading, how a record becomes a document or a dead letter, and the lag
//! metrics.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::documents::Document;
use crate::metrics::METRICS;
use crate::topics::kafka::{Change, KafkaBus, RejectedDocument, Span};

/// Dead letters waiting for the producer; beyond this many, more are only logged and counted.
const REJECTED_QUEUE: usize = 1024;

/// Stored with what an index holds: the topic, and per partition the next offset to apply.
#[derive(Serialize, Deserialize, Default, PartialEq, Debug, Clone)]
pub struct Applied {
    pub topic: String,
    pub next: BTreeMap<i32, i64>,
}

/// Where a follower starts reading each partition, and the end offsets it must reach before it is
/// caught up (partitions it starts at their end are not waited for).
pub struct Start {
    pub from: HashMap<i32, i64>,
    pub behind: HashMap<i32, i64>,
}

impl Applied {
    /// The offsets stored with an index, if they are this topic's (and not past its end) and nothing
    /// since was lost to retention or compaction; `None` means the index must be rebuilt from the
    /// topic's start.
    fn resumable(self, topic: &str, spans: &[Span]) -> Option<Applied> {
        (self.topic == topic && !outdated(&self, spans)).then_some(self)
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

/// Where a follower resumes, given the offsets stored with its index: those offsets when they still
/// hold, else none, and `true` when the index must be emptied first (it holds what another topic's
/// records, or records since lost to retention or compaction, put there). With nothing stored, what
/// the index holds (a corpus from `lacuna index`) stays, and the topic's documents go on top of it.
pub fn resume(stored: Option<Applied>, topic: &str, spans: &[Span]) -> (Applied, bool) {
    let fresh = || Applied { topic: topic.to_string(), next: BTreeMap::new() };
    let Some(stored) = stored else { return (fresh(), false) };
    let next = stored.next.clone();
    match stored.resumable(topic, spans) {
        Some(applied) => (applied, false),
        None => {
            tracing::warn!(
                stored = ?next, topic,
                "the index's offsets are not the topic's, or older than its earliest records: rebuilding from the topic"
            );
            (fresh(), true)
        }
    }
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
        let applied = Applied { topic: "t".into(), next: BTreeMap::from([(0, 10), (1, 3)]) };
        assert!(!outdated(&applied, &[span(0, 0, 12), span(1, 3, 3)]), "3 is partition 1's earliest: nothing missed");
        assert!(outdated(&applied, &[span(0, 0, 12), span(1, 4, 9)]), "offset 3 of partition 1 is gone unseen");
        assert!(outdated(&applied, &[span(0, 0, 12), span(2, 1, 5)]), "a partition it never read lost its start");
        assert!(!outdated(&applied, &[span(2, 0, 5)]), "a new partition read from its start");
        assert!(applied.clone().resumable("t", &[span(0, 0, 12)]).is_some());
        assert!(applied.clone().resumable("other", &[span(0, 0, 12)]).is_none(), "another topic's offsets");
        let fresh = Applied { topic: "t".into(), next: BTreeMap::new() };
        assert_eq!(resume(None, "t", &[span(0, 0, 12)]), (fresh.clone(), false), "nothing stored: keep what is there");
        assert_eq!(resume(Some(applied.clone()), "t", &[span(0, 0, 12)]), (applied.clone(), false));
        let other = Applied { topic: "other".into(), next: BTreeMap::new() };
        assert_eq!(resume(Some(applied), "other", &[span(0, 0, 12)]), (other, true), "empty it and start over");
    }

    /// Offsets past a partition's end were not this topic's: it was deleted and created again, or
    /// the follower now reads another cluster. Resuming there would skip the new topic's records, and
    /// the follower would call itself caught up at once (issue 57, item 2).
    #[test]
    fn stored_offsets_past_a_partitions_end_are_outdated() {
        let applied = Applied { topic: "t".into(), next: BTreeMap::from([(0, 10)]) };
        assert!(!outdated(&applied, &[span(0, 0, 10)]), "at the end: caught up, nothing missed");
        assert!(outdated(&applied, &[span(0, 0, 4)]), "offset 10 of a partition that ends at 4");
        assert_eq!(resume(Some(applied), "t", &[span(0, 0, 4)]).1, true, "rebuilt from the topic's start");
    }

    #[test]
    fn a_follower_starts_at_its_stored_offsets_and_waits_only_for_partitions_behind() {
        let mut applied = Applied { topic: "t".into(), next: BTreeMap::from([(0, 10)]) };
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
