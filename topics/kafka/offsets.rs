//! Which fetched offsets of each partition a stage has taken and finished, so that an offset is
//! stored only once every offset before it in its partition is done (at-least-once, in order), and a
//! revoked partition's late acknowledgements are ignored. After an aborted transaction every
//! partition is rewound: what was fetched before is forgotten, and nothing fetched until the poller
//! has sought back to the committed positions can be claimed.

use std::collections::{BTreeMap, HashMap};

/// Where each fetched offset of a partition stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// Fetched, waiting for the stage to take it.
    Fetched,
    /// Taken by the stage: a rebalance waits for it.
    Started,
    Done,
}

/// Which offsets of each partition are in flight, and how far each has got. Per partition, so a
/// revocation touches only the partitions it revokes (as incremental, cooperative rebalancing
/// revokes them) and the others carry on.
#[derive(Default)]
pub(super) struct OffsetTracker {
    partitions: HashMap<(String, i32), Partition>,
    /// Never reused: a partition revoked and assigned back starts an assignment no older delivery has.
    next_assignment: u64,
    /// Between an abort's rewind and the poller's seek back to the committed positions: records
    /// fetched meanwhile come from before the seek and are never this process's to work on.
    rewinding: bool,
}

/// The assignment of records fetched while rewinding: no partition ever has it.
pub(super) const STALE: u64 = 0;

#[derive(Default)]
struct Partition {
    /// Acknowledgements and claims of deliveries from another assignment are ignored.
    assignment: u64,
    offsets: BTreeMap<i64, Progress>,
    /// The offset after the last one done in order, once one is.
    next: Option<i64>,
    /// Its revocation waits for the work started on it: nothing more of it is taken on.
    closing: bool,
}

impl OffsetTracker {
    fn partition(&mut self, topic: &str, partition: i32) -> &mut Partition {
        let next = &mut self.next_assignment;
        self.partitions.entry((topic.to_string(), partition)).or_insert_with(|| {
            *next += 1;
            Partition { assignment: *next, offsets: BTreeMap::new(), next: None, closing: false }
        })
    }

    pub(super) fn register(&mut self, topic: &str, partition: i32, offset: i64) -> u64 {
        if self.rewinding {
            return STALE;
        }
        let partition = self.partition(topic, partition);
        partition.offsets.insert(offset, Progress::Fetched);
        partition.assignment
    }

    /// The stage takes the offset on; false when its partition was revoked since it was fetched, or
    /// is being revoked.
    pub(super) fn claim(&mut self, topic: &str, partition: i32, offset: i64, assignment: u64) -> bool {
        if !self.owns(topic, partition, offset, assignment) {
            return false;
        }
        let partition = self.partition(topic, partition);
        if partition.closing {
            return false;
        }
        partition.offsets.insert(offset, Progress::Started);
        true
    }

    /// Whether the offset, fetched in `assignment`, is still this process's: its partition not
    /// revoked (nor revoked and assigned again) since.
    pub(super) fn owns(&self, topic: &str, partition: i32, offset: i64, assignment: u64) -> bool {
        self.partitions
            .get(&(topic.to_string(), partition))
            .is_some_and(|p| p.assignment == assignment && p.offsets.contains_key(&offset))
    }

    /// Marks an offset done; returns the offset to store when the partition's lowest offsets are done.
    pub(super) fn ack(&mut self, topic: &str, partition: i32, offset: i64, assignment: u64) -> Option<i64> {
        let partition = self.partitions.get_mut(&(topic.to_string(), partition))?;
        if partition.assignment != assignment {
            return None;
        }
        partition.offsets.insert(offset, Progress::Done);
        let mut next = None;
        while let Some((&lowest, &progress)) = partition.offsets.iter().next() {
            if progress != Progress::Done {
                break;
            }
            partition.offsets.remove(&lowest);
            next = Some(lowest + 1);
        }
        if next.is_some() {
            partition.next = next;
        }
        next
    }

    /// Per partition, the position to commit (the first offset not done, or the one after the last
    /// done) and the offsets done beyond it: what an exactly-once commit carries.
    pub(super) fn positions(&self) -> Vec<(String, i32, i64, Vec<i64>)> {
        let mut positions = Vec::new();
        for ((topic, number), partition) in &self.partitions {
            // Done offsets leave the front of the map, so its first key is the first not done.
            let Some(position) = partition.offsets.keys().next().copied().or(partition.next) else { continue };
            let done = partition.offsets.iter().filter(|(_, p)| **p == Progress::Done).map(|(o, _)| *o).collect();
            positions.push((topic.clone(), *number, position, done));
        }
        positions
    }

    /// Offsets of these partitions the stage is working on.
    pub(super) fn started(&self, partitions: &[(String, i32)]) -> usize {
        partitions
            .iter()
            .filter_map(|key| self.partitions.get(key))
            .map(|p| p.offsets.values().filter(|progress| **progress == Progress::Started).count())
            .sum()
    }

    /// These partitions are being revoked: what was started on them finishes, and nothing more of
    /// them is taken on. A record taken now would be done for nothing: its outcome is dropped once
    /// the partition is gone, and the new owner does it again.
    pub(super) fn close(&mut self, partitions: &[(String, i32)]) {
        for key in partitions {
            if let Some(partition) = self.partitions.get_mut(key) {
                partition.closing = true;
            }
        }
    }

    /// Forgets these partitions: what is still fetched or unfinished there is their next owner's.
    pub(super) fn revoke(&mut self, partitions: &[(String, i32)]) {
        for key in partitions {
            self.partitions.remove(key);
        }
    }

    /// The open transaction was aborted: every delivery fetched so far, finished or not, is no longer
    /// this process's to publish or acknowledge, and what is fetched until [`OffsetTracker::rewound`]
    /// is stale too. The partitions it had started on, for the claims to let go.
    pub(super) fn rewind(&mut self) -> Vec<(String, i32)> {
        self.rewinding = true;
        self.partitions.drain().map(|(key, _)| key).collect()
    }

    /// The poller sought back to the committed positions: records fetched from now on are work again.
    pub(super) fn rewound(&mut self) {
        self.partitions.clear();
        self.rewinding = false;
    }

    /// Whether a rewind waits for the poller's seek.
    pub(super) fn rewinding(&self) -> bool {
        self.rewinding
    }
}

#[cfg(test)]
mod tests {
    use super::OffsetTracker;

    #[test]
    fn offsets_are_stored_in_order_per_partition() {
        let mut tracker = OffsetTracker::default();
        let assignment = (0..3).map(|o| tracker.register("t", 0, o)).last().unwrap();
        assert_eq!(tracker.ack("t", 0, 2, assignment), None, "offset 2 waits for 0 and 1");
        assert_eq!(tracker.ack("t", 0, 0, assignment), Some(1));
        assert_eq!(tracker.ack("t", 0, 1, assignment), Some(3), "1 done: everything through 2 is done");
    }

    #[test]
    fn a_commit_position_stops_at_the_first_record_not_done_and_lists_those_done_beyond() {
        let mut tracker = OffsetTracker::default();
        let assignment = (10..14).map(|o| tracker.register("t", 0, o)).last().unwrap();
        tracker.ack("t", 0, 11, assignment);
        tracker.ack("t", 0, 13, assignment);
        assert_eq!(tracker.positions(), vec![("t".to_string(), 0, 10, vec![11, 13])]);
        tracker.ack("t", 0, 10, assignment);
        assert_eq!(tracker.positions(), vec![("t".to_string(), 0, 12, vec![13])]);
        tracker.ack("t", 0, 12, assignment);
        assert_eq!(tracker.positions(), vec![("t".to_string(), 0, 14, vec![])], "all done: after the last");
    }

    #[test]
    fn a_revocation_forgets_only_its_partitions() {
        let mut tracker = OffsetTracker::default();
        let (kept, revoked) = (tracker.register("t", 0, 5), tracker.register("t", 1, 7));
        assert!(tracker.claim("t", 0, 5, kept) && tracker.claim("t", 1, 7, revoked));
        assert_eq!(tracker.started(&[("t".into(), 1)]), 1, "a revocation waits for this one");
        assert!(tracker.owns("t", 1, 7, revoked));
        tracker.revoke(&[("t".into(), 1)]);
        assert!(!tracker.owns("t", 1, 7, revoked), "its outcome is the new owner's to publish");
        assert!(tracker.owns("t", 0, 5, kept));
        assert_eq!(tracker.ack("t", 1, 7, revoked), None, "a revoked partition's late ack is ignored");
        assert_eq!(tracker.ack("t", 0, 5, kept), Some(6), "the other partition carries on");
    }

    /// An abort rewinds everything: no delivery fetched before it, done or not, is owned, and nothing
    /// fetched before the poller's seek can be claimed; after it, records are work again.
    #[test]
    fn a_rewind_disowns_every_delivery_until_the_poller_has_sought_back() {
        let mut tracker = OffsetTracker::default();
        let (done, started) = (tracker.register("t", 0, 5), tracker.register("t", 1, 7));
        assert!(tracker.claim("t", 1, 7, started));
        tracker.ack("t", 0, 5, done);
        assert_eq!(tracker.rewind().len(), 2);
        assert!(!tracker.owns("t", 1, 7, started) && tracker.positions().is_empty());
        let before_the_seek = tracker.register("t", 0, 6);
        assert!(!tracker.claim("t", 0, 6, before_the_seek), "fetched before the seek: stale");
        tracker.rewound();
        let again = tracker.register("t", 0, 5);
        assert!(tracker.claim("t", 0, 5, again));
        assert_eq!(tracker.ack("t", 0, 5, again), Some(6));
    }

    #[test]
    fn a_delivery_fetched_before_its_partition_moved_is_not_claimed() {
        let mut tracker = OffsetTracker::default();
        let old = tracker.register("t", 0, 5);
        tracker.revoke(&[("t".into(), 0)]);
        let new = tracker.register("t", 0, 5);
        assert!(!tracker.claim("t", 0, 5, old), "its new owner reads it again");
        assert!(tracker.claim("t", 0, 5, new));
    }
}
