//! The ledger of offsets done beyond a committed position (exactly-once). Stages finish records out
//! of order, so a commit carries, per partition, the position before the first record not done, and
//! in the offset's metadata the offsets done beyond it (`lacuna-done:7-9,12`): a process that resumes
//! there skips those, whose outputs the same transaction committed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaResult;

use super::rebalance::TrackingContext;
use super::wire::coordinated;

/// How a commit's metadata names the offsets done beyond its position.
const DONE_PREFIX: &str = "lacuna-done:";
/// Kafka keeps at most 4 KiB of metadata per committed offset by default.
const MAX_METADATA: usize = 4000;

/// Offsets as inclusive ranges, start to end: a ledger costs its number of ranges, however many
/// offsets they span (a first record stuck for an hour leaves one range of everything after it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Ranges(BTreeMap<i64, i64>);

impl Ranges {
    /// Ranges of sorted offsets.
    fn of_sorted(offsets: impl IntoIterator<Item = i64>) -> Ranges {
        let mut ranges = Ranges::default();
        for offset in offsets {
            ranges.push(offset, offset);
        }
        ranges
    }

    /// Adds `start..=end`, which starts at or after every range held; it joins the last one where
    /// they touch or overlap.
    fn push(&mut self, start: i64, end: i64) {
        if let Some((_, last)) = self.0.iter_mut().next_back()
            && start <= *last + 1
        {
            *last = (*last).max(end);
            return;
        }
        self.0.insert(start, end);
    }

    fn contains(&self, offset: &i64) -> bool {
        self.0.range(..=*offset).next_back().is_some_and(|(_, end)| offset <= end)
    }

    /// The ranges cut to the offsets at or after `position`.
    fn at_or_after(&self, position: i64) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.0.iter().filter(move |(_, end)| **end >= position).map(move |(start, end)| ((*start).max(position), *end))
    }
}

/// `lacuna-done:7-9,12`: offsets done beyond a committed position, as ranges. Empty when none.
/// Longer than Kafka keeps: the later ones are left out, and their records redone after a crash.
pub(super) fn encode_done(done: &Ranges) -> String {
    let mut note = String::new();
    for (&start, &end) in &done.0 {
        let range = if start == end { start.to_string() } else { format!("{start}-{end}") };
        if DONE_PREFIX.len() + note.len() + range.len() + 1 > MAX_METADATA {
            tracing::warn!("too many records done out of order to list: those left out are redone after a crash");
            break;
        }
        if !note.is_empty() {
            note.push(',');
        }
        note.push_str(&range);
    }
    if note.is_empty() { note } else { format!("{DONE_PREFIX}{note}") }
}

/// The offsets a commit at `position` lists as done beyond it: this process's (`own`, sorted), and
/// those an earlier owner listed that this process has not reached yet. Left out, those would be
/// redone after a crash, though their outputs are committed.
pub(super) fn listed_done(own: Vec<i64>, inherited: &Ranges, position: i64) -> Ranges {
    let own = Ranges::of_sorted(own.into_iter().filter(|offset| *offset >= position));
    let mut all: Vec<(i64, i64)> = own.at_or_after(position).chain(inherited.at_or_after(position)).collect();
    all.sort_unstable();
    let mut listed = Ranges::default();
    for (start, end) in all {
        listed.push(start, end);
    }
    listed
}

/// The offsets a commit's metadata says were done beyond its position. Ranges that do not parse, or
/// run backwards, are not ours: skipped, so those records are redone (at least once, never lost).
fn decode_done(metadata: &str) -> Ranges {
    let Some(list) = metadata.strip_prefix(DONE_PREFIX) else { return Ranges::default() };
    let mut ranges: Vec<(i64, i64)> = list
        .split(',')
        .filter_map(|range| {
            let (start, end) = range.split_once('-').unwrap_or((range, range));
            Some((start.parse::<i64>().ok()?, end.parse::<i64>().ok()?)).filter(|(start, end)| start <= end)
        })
        .collect();
    ranges.sort_unstable();
    let mut done = Ranges::default();
    for (start, end) in ranges {
        done.push(start, end);
    }
    done
}

/// Which offsets of each partition an earlier owner finished beyond its committed position, read
/// from the committed metadata once per assignment of the partition.
#[derive(Default)]
pub(super) struct DoneBefore {
    partitions: Mutex<HashMap<(String, i32), (u64, Ranges)>>,
}

impl DoneBefore {
    /// What the earlier owner listed for this partition, as read in this assignment (empty before).
    pub(super) fn inherited(&self, topic: &str, partition: i32) -> Ranges {
        let partitions = self.partitions.lock().unwrap();
        partitions.get(&(topic.to_string(), partition)).map(|(_, done)| done.clone()).unwrap_or_default()
    }

    /// Whether an earlier owner finished `offset`, read from the last commit once per assignment.
    /// The read is asked again while the group's coordinator moves or loads (a restart right after
    /// a node was lost). An error means the ledger cannot be read: the record may neither run (its
    /// outputs may be committed already) nor be skipped (they may not), so the caller ends its feed
    /// and a restart reads the ledger again. Nothing is kept then.
    pub(super) fn contains(
        &self,
        consumer: &StreamConsumer<TrackingContext>,
        (topic, partition, offset): (&str, i32, i64),
        assignment: u64,
    ) -> KafkaResult<bool> {
        let key = (topic.to_string(), partition);
        if let Some((_, done)) = self.partitions.lock().unwrap().get(&key).filter(|(seen, _)| *seen == assignment) {
            return Ok(done.contains(&offset));
        }
        // Read without the lock: every commit needs it (`inherited`), with the gate closed.
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, partition);
        let committed = coordinated(|left| consumer.committed_offsets(list.clone(), left))?;
        let element = committed.find_partition(topic, partition);
        let (position, metadata) = element.as_ref().map_or((None, ""), |e| (Some(e.offset()), e.metadata()));
        // No committed offset reads as no metadata: nothing done beyond it.
        tracing::debug!(topic, partition, first_fetched = offset, ?position, metadata, "resuming from the commit");
        let done = decode_done(metadata);
        let found = done.contains(&offset);
        self.partitions.lock().unwrap().insert(key, (assignment, done));
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_done_out_of_order_survive_their_encoding_as_ranges() {
        let done = Ranges::of_sorted([7, 8, 9, 12, 14, 15]);
        let note = encode_done(&done);
        assert_eq!(note, "lacuna-done:7-9,12,14-15");
        assert_eq!(decode_done(&note), done);
        assert_eq!(encode_done(&Ranges::default()), "");
        assert_eq!((decode_done(""), decode_done("3:1,4:2")), (Ranges::default(), Ranges::default()), "not ours");
    }

    /// A process that resumed at 10 inherited 11, 15 and 20 as done by the owner before it, and has
    /// fetched only up to 13 so far: its commit must still list 15 and 20, or a crash before it
    /// fetches them would have the next owner redo them (their outputs are already committed).
    #[test]
    fn a_commit_keeps_listing_what_an_earlier_owner_did_beyond_what_was_fetched() {
        let inherited = Ranges::of_sorted([11, 15, 20]);
        assert_eq!(
            listed_done(vec![11, 13], &inherited, 12),
            Ranges::of_sorted([13, 15, 20]),
            "11 is behind the position now"
        );
        assert_eq!(listed_done(vec![], &inherited, 21), Ranges::default());
        let long = decode_done("lacuna-done:5-150000");
        assert_eq!(encode_done(&listed_done(vec![150_001], &long, 100)), "lacuna-done:100-150001", "cut, joined");
    }

    /// A first record stuck (an LLM outage) while 150,001 later ones finish: one range in the commit's
    /// metadata, and every offset of it must be skipped on resume, or its outputs are committed twice.
    #[test]
    fn a_long_range_done_out_of_order_is_read_back_whole() {
        let done: Vec<i64> = (1..=150_001).collect();
        let note = encode_done(&Ranges::of_sorted(done.iter().copied()));
        assert_eq!(note, "lacuna-done:1-150001");
        let read = decode_done(&note);
        assert!(done.iter().all(|offset| read.contains(offset)), "offsets past 100,001 of a range were dropped");
        assert!(!read.contains(&0) && !read.contains(&150_002));
    }

    #[test]
    fn a_list_longer_than_kafka_keeps_is_cut_not_refused() {
        let done: Vec<i64> = (0..4000).map(|i| i * 2).collect();
        let note = encode_done(&Ranges::of_sorted(done.iter().copied()));
        assert!(note.len() <= MAX_METADATA);
        assert!(decode_done(&note).0.iter().all(|(start, end)| (*start..=*end).all(|o| done.contains(&o))));
    }

    /// Issue 74's one unexplained repeat, in the transaction-coordinator row: a restart resumed while
    /// the group's coordinator moved (its node killed), and its read of the ledger was answered *not
    /// coordinator*, which librdkafka hands back as it is. Read as "nothing done", it had the
    /// records the last commit listed as done redone, and their outputs committed twice. On
    /// librdkafka's mock cluster: the last commit at 1 with 2-3 done beyond it, and the read answered
    /// *not coordinator*, then *loading*.
    #[tokio::test]
    async fn a_ledger_read_while_the_coordinator_moves_is_asked_again_instead_of_redoing() {
        use std::sync::Arc;

        use rdkafka::config::ClientConfig;
        use rdkafka::mocking::MockCluster;
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

        use super::super::offsets::OffsetTracker;
        use super::super::wire::OffsetNotes;

        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("t", 1, 1).unwrap();
        let base = ClientConfig::new().set("bootstrap.servers", cluster.bootstrap_servers()).clone();
        OffsetNotes::new(&base, "g").unwrap().write("t", 0, 1, "lacuna-done:2-3".into()).unwrap();
        let context = super::super::rebalance::context_for_tests(Arc::new(Mutex::new(OffsetTracker::default())));
        let consumer: StreamConsumer<TrackingContext> =
            base.clone().set("group.id", "g").create_with_context(context).unwrap();
        use RDKafkaRespErr::*;
        let moving = [RD_KAFKA_RESP_ERR_NOT_COORDINATOR, RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS];
        cluster.request_errors(RDKafkaApiKey::OffsetFetch, &moving);
        let done = DoneBefore::default();
        assert!(
            done.contains(&consumer, ("t", 0, 2), 1).expect("asked again"),
            "offset 2 was done before the last commit: redone, its outputs are committed twice"
        );
    }
}
