//! How many times earlier processes of a consumer group started each record, kept on the broker so
//! that it survives the crash it is about. A record that kills its stage (an out-of-memory kill, a
//! crash in native code) is redelivered to the restarted process, which would crash again, for ever.
//! Before a stage starts a record, the count of starts of the records in flight in that partition
//! is committed, as offset metadata, in a group of its own (`<group>.claims`, never joined); a
//! restarted process reads it back and hands each record over with the starts before it
//! ([`crate::topics::Delivery::redeliveries`]), and the runner ends a record started
//! `retry.max_attempts` times in an error record instead of starting it again.
//!
//! A crash is counted against every record in flight when it happens, the innocent ones beside the
//! culprit included. So a record started before (a suspect) is started again alone, with nothing
//! else in flight in its stage's process (the runner's feeder): a crash then is its own, and the
//! others it was blamed beside reach `retry.max_attempts` only by crashing a process themselves.
//!
//! A record still at work when its partition is revoked was let go, not crashed on: the revocation
//! puts its count back to what it was before this process started it, and forgets the partition's
//! counts, which another owner may change before the partition comes back.
//!
//! A commit is one broker round trip per record started; the LLM stages spend seconds per record.
//! Where the broker refuses such commits, a warning says so once and crash loops are not counted.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::config::ClientConfig;

use super::wire::OffsetNotes;

/// The most starts one partition's metadata lists (Kafka keeps 4 KiB of it by default).
const MAX_LISTED: usize = 100;

pub(super) struct Claims {
    notes: OffsetNotes,
    /// Starts per offset of each partition: those read back from earlier processes, and this one's.
    partitions: Mutex<HashMap<(String, i32), BTreeMap<i64, u32>>>,
    /// The offsets of each partition this process started and has not finished.
    started: Mutex<HashMap<(String, i32), BTreeSet<i64>>>,
    /// What this process last committed for each partition.
    committed: Mutex<HashMap<(String, i32), String>>,
    /// Numbers each partition's counts as they are taken, so that a write of older counts (a done
    /// suspect's, written from a thread of its own) never lands over newer ones.
    taken: AtomicU64,
    /// The number of the counts last written per partition; held while writing, so writes go one
    /// at a time.
    written: Mutex<HashMap<(String, i32), u64>>,
    warned: AtomicBool,
}

impl Claims {
    pub(super) fn new(base: ClientConfig, group: &str) -> Option<Claims> {
        let notes = OffsetNotes::new(&base, &format!("{group}.claims"))
            .map_err(|error| tracing::warn!(%error, "no claims consumer: crash loops are not counted"))
            .ok()?;
        Some(Claims {
            notes,
            partitions: Mutex::default(),
            started: Mutex::default(),
            committed: Mutex::default(),
            taken: AtomicU64::new(0),
            written: Mutex::default(),
            warned: AtomicBool::new(false),
        })
    }

    /// How many times earlier processes started `offset` (reads the partition's counts from the
    /// broker on first use).
    pub(super) fn earlier(&self, topic: &str, partition: i32, offset: i64) -> u32 {
        let key = (topic.to_string(), partition);
        if let Some(counts) = self.partitions.lock().unwrap().get(&key) {
            return counts.get(&offset).copied().unwrap_or(0);
        }
        let counts = self.read(topic, partition);
        let count = counts.get(&offset).copied().unwrap_or(0);
        self.partitions.lock().unwrap().entry(key).or_insert(counts);
        count
    }

    /// This process starts `offset`, for the `count`th time in all: committed before it does.
    pub(super) fn start(&self, topic: &str, partition: i32, offset: i64, count: u32) {
        let metadata = {
            let mut partitions = self.partitions.lock().unwrap();
            let counts = partitions.entry((topic.to_string(), partition)).or_default();
            counts.insert(offset, count);
            while counts.len() > MAX_LISTED {
                counts.pop_first();
            }
            self.taken(counts)
        };
        self.started.lock().unwrap().entry((topic.to_string(), partition)).or_default().insert(offset);
        self.commit(topic, partition, offset, metadata);
    }

    /// These partitions were revoked: what this process started there and did not finish was let go
    /// (its new owner reads it again), so each such record's count goes back to its earlier
    /// processes' starts, committed before the new owner can read it (a cooperative revocation
    /// completes before the partition is assigned again). The partition's counts are forgotten:
    /// read again from the broker should it come back. Records finished since the last commit are
    /// unlisted too: one finished out of order is read again by the new owner.
    pub(super) fn release(&self, partitions: &[(String, i32)]) {
        for key in partitions {
            let counts = self.partitions.lock().unwrap().remove(key);
            let unfinished = self.started.lock().unwrap().remove(key).unwrap_or_default();
            let last = self.committed.lock().unwrap().remove(key);
            let (Some(mut counts), Some(last)) = (counts, last) else { continue };
            for offset in &unfinished {
                match counts.get(offset) {
                    Some(&count) if count > 1 => counts.insert(*offset, count - 1),
                    _ => counts.remove(offset),
                };
            }
            let metadata = self.taken(&counts);
            if metadata.0 != last {
                let offset = counts.keys().chain(&unfinished).next().copied().unwrap_or(0);
                self.commit(&key.0, key.1, offset, metadata);
                self.committed.lock().unwrap().remove(key);
            }
        }
    }

    /// [`Claims::release`] of every partition this process counted starts in: after an aborted
    /// transaction, everything started since the last commit is redone here, and was no crash.
    pub(super) fn release_all(&self) {
        let keys: Vec<(String, i32)> = self.partitions.lock().unwrap().keys().cloned().collect();
        self.release(&keys);
    }

    /// Forgets these partitions without a word to the broker: they were lost to another member,
    /// which may count starts there already.
    pub(super) fn forget(&self, partitions: &[(String, i32)]) {
        for key in partitions {
            self.partitions.lock().unwrap().remove(key);
            self.started.lock().unwrap().remove(key);
            self.committed.lock().unwrap().remove(key);
        }
    }

    /// `offset` is done: it is no longer listed in the next commit. One that an earlier crash was
    /// blamed on is unlisted on the broker at once: were this process to crash before the
    /// partition's next start, that stale count would blame the finished record again when it is
    /// read once more (its offset not yet committed). Rare: only records started after a crash.
    /// Written from a thread of its own: this runs in the record's acknowledgement, inside its
    /// hold of the open transaction, which must not wait on the broker.
    pub(super) fn done(self: &Arc<Self>, topic: &str, partition: i32, offset: i64) {
        if let Some(started) = self.started.lock().unwrap().get_mut(&(topic.to_string(), partition)) {
            started.remove(&offset);
        }
        let metadata = {
            let mut partitions = self.partitions.lock().unwrap();
            let Some(counts) = partitions.get_mut(&(topic.to_string(), partition)) else { return };
            match counts.remove(&offset) {
                Some(count) if count > 1 => self.taken(counts),
                _ => return,
            }
        };
        let (claims, topic) = (self.clone(), topic.to_string());
        let unlist = move || claims.commit(&topic, partition, offset, metadata);
        if let Err(error) = std::thread::Builder::new().name("kafka-claims".into()).spawn(unlist) {
            tracing::warn!(%error, "no thread to unlist a finished record's starts: it stays listed");
        }
    }

    /// The partition's counts encoded, numbered as taken (with `partitions` locked, or once they left it).
    fn taken(&self, counts: &BTreeMap<i64, u32>) -> (String, u64) {
        (encode(counts), self.taken.fetch_add(1, Ordering::Relaxed))
    }

    fn commit(&self, topic: &str, partition: i32, offset: i64, (metadata, number): (String, u64)) {
        let key = (topic.to_string(), partition);
        let mut written = self.written.lock().unwrap();
        if written.get(&key).is_some_and(|last| *last > number) {
            return; // newer counts are on the broker already
        }
        match self.notes.write(topic, partition, offset, metadata.clone()) {
            Ok(()) => {
                written.insert(key.clone(), number);
                self.committed.lock().unwrap().insert(key, metadata);
            }
            Err(error) if !self.warned.swap(true, Ordering::Relaxed) => {
                tracing::warn!(%error, "cannot commit record starts: crash loops are not counted");
            }
            Err(_) => {}
        }
    }

    fn read(&self, topic: &str, partition: i32) -> BTreeMap<i64, u32> {
        match self.notes.read(topic, partition) {
            Ok(metadata) => decode(&metadata),
            Err(error) => {
                tracing::warn!(%error, topic, partition, "cannot read record starts: counted from 0");
                BTreeMap::new()
            }
        }
    }
}

/// `offset:count` pairs, comma-separated.
fn encode(counts: &BTreeMap<i64, u32>) -> String {
    counts.iter().map(|(offset, count)| format!("{offset}:{count}")).collect::<Vec<_>>().join(",")
}

fn decode(metadata: &str) -> BTreeMap<i64, u32> {
    metadata
        .split(',')
        .filter_map(|pair| {
            let (offset, count) = pair.split_once(':')?;
            Some((offset.parse().ok()?, count.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On librdkafka's mock cluster, which keeps committed offsets' metadata as a broker does.
    #[test]
    fn a_revoked_partition_uncounts_what_was_let_go_and_is_read_again_when_it_comes_back() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        cluster.create_topic("t", 1, 1).unwrap();
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", cluster.bootstrap_servers());
        let (here, elsewhere) = (Claims::new(base.clone(), "g").unwrap(), Claims::new(base, "g").unwrap());
        // 5 is started here; 6 was fetched and waits.
        assert_eq!((here.earlier("t", 0, 5), here.earlier("t", 0, 6)), (0, 0));
        here.start("t", 0, 5, 1);
        here.release(&[("t".to_string(), 0)]);
        assert_eq!(elsewhere.earlier("t", 0, 5), 0, "let go at the revocation: no crash to count");
        // The next owner starts 6 and crashes.
        elsewhere.start("t", 0, 6, 1);
        assert_eq!(here.earlier("t", 0, 6), 1, "the partition is back: its counts are read again");
    }

    /// A record a crash was blamed on is unlisted on the broker when it is done, from its
    /// acknowledgement, which runs inside the event's hold of the open transaction (finding 4 of
    /// issue 74): the broker's slow answer must not hold the transaction up, and the unlisting
    /// must still land.
    #[test]
    fn a_done_suspect_is_unlisted_without_waiting_for_the_broker() {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        cluster.create_topic("t", 1, 1).unwrap();
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", cluster.bootstrap_servers());
        let (here, elsewhere) = (Arc::new(Claims::new(base.clone(), "g").unwrap()), Claims::new(base, "g").unwrap());
        here.earlier("t", 0, 5);
        here.start("t", 0, 5, 2);
        cluster.broker_round_trip_time(1, std::time::Duration::from_secs(2)).unwrap();
        let asked = std::time::Instant::now();
        here.done("t", 0, 5);
        assert!(asked.elapsed() < std::time::Duration::from_secs(1), "waited {:?} for the broker", asked.elapsed());
        cluster.broker_round_trip_time(1, std::time::Duration::ZERO).unwrap();
        let landed = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            elsewhere.read("t", 0).get(&5).is_none()
        });
        assert!(landed, "the suspect is still listed on the broker");
    }

    #[test]
    fn counts_survive_their_encoding_and_junk_is_ignored() {
        let counts = BTreeMap::from([(7, 1), (12, 3)]);
        assert_eq!(decode(&encode(&counts)), counts);
        assert_eq!(decode(""), BTreeMap::new());
        assert_eq!(decode("x,5:2,9:"), BTreeMap::from([(5, 2)]));
    }
}
