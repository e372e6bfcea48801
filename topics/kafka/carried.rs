//! What an exactly-once commit carries of each consumer: the position of every partition it holds,
//! with the offsets done beyond it in the position's metadata, sent with the consumer's group
//! metadata (a zombie of an older group generation is fenced, KIP-447). Nothing that the last
//! commit already carried is sent again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use rdkafka::consumer::StreamConsumer;
use rdkafka::{Offset, TopicPartitionList};

use super::done_ledger::{DoneBefore, encode_done, listed_done};
use super::offsets::OffsetTracker;
use super::rebalance::TrackingContext;

/// A partition of a group's topic.
type GroupPartition = (String, String, i32);

/// What the last commit carried, per group and partition (position and done offsets' note):
/// nothing new, no commit.
pub(super) type Positions = HashMap<GroupPartition, (i64, String)>;

/// A consumer whose positions each commit carries: its offsets, what an earlier owner did beyond
/// them, and how to wake its poller to seek back after an abort.
pub(super) struct Tracked {
    pub(super) consumer: Weak<StreamConsumer<TrackingContext>>,
    pub(super) tracker: Arc<Mutex<OffsetTracker>>,
    pub(super) done_before: Arc<DoneBefore>,
    pub(super) rewind: Arc<tokio::sync::Notify>,
}

/// One consumer's share of a commit, sent with its group metadata.
pub(super) struct Carried {
    pub(super) offsets: TopicPartitionList,
    /// What `offsets` holds, to remember once the commit lands.
    pub(super) sent: Vec<(GroupPartition, (i64, String))>,
}

impl Tracked {
    /// What the next commit carries of this consumer, a member of `group`: nothing when the last
    /// commit (`last`) carried it all already.
    pub(super) fn carried(&self, group: &str, last: &Positions) -> Result<Option<Carried>, String> {
        let mut offsets = TopicPartitionList::new();
        let mut sent = Vec::new();
        for (topic, partition, position, done) in self.tracker.lock().unwrap().positions() {
            let inherited = self.done_before.inherited(&topic, partition);
            let note = encode_done(&listed_done(done, &inherited, position));
            let key = (group.to_string(), topic.clone(), partition);
            if last.get(&key) == Some(&(position, note.clone())) {
                continue;
            }
            offsets.add_partition_offset(&topic, partition, Offset::Offset(position)).map_err(|e| e.to_string())?;
            if !note.is_empty() {
                offsets.find_partition(&topic, partition).expect("just added").set_metadata(note.clone());
            }
            sent.push((key, (position, note)));
        }
        Ok((!sent.is_empty()).then_some(Carried { offsets, sent }))
    }
}
