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
//! A commit is one broker round trip per record started; the LLM stages spend seconds per record.
//! Where the broker refuses such commits, a warning says so once and crash loops are not counted.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::config::ClientConfig;

use super::wire::OffsetNotes;

/// The most starts one partition's metadata lists (Kafka keeps 4 KiB of it by default).
const MAX_LISTED: usize = 100;

pub(super) struct Claims {
    notes: OffsetNotes,
    /// Starts per offset of each partition: those read back from earlier processes, and this one's.
    partitions: Mutex<HashMap<(String, i32), BTreeMap<i64, u32>>>,
    warned: AtomicBool,
}

impl Claims {
    pub(super) fn new(base: ClientConfig, group: &str) -> Option<Claims> {
        let notes = OffsetNotes::new(&base, &format!("{group}.claims"))
            .map_err(|error| tracing::warn!(%error, "no claims consumer: crash loops are not counted"))
            .ok()?;
        Some(Claims { notes, partitions: Mutex::default(), warned: AtomicBool::new(false) })
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
            encode(counts)
        };
        self.commit(topic, partition, offset, metadata);
    }

    /// `offset` is done: it is no longer listed in the next commit. One that an earlier crash was
    /// blamed on is unlisted on the broker at once: were this process to crash before the
    /// partition's next start, that stale count would blame the finished record again when it is
    /// read once more (its offset not yet committed). Rare: only records started after a crash.
    pub(super) fn done(&self, topic: &str, partition: i32, offset: i64) {
        let metadata = {
            let mut partitions = self.partitions.lock().unwrap();
            let Some(counts) = partitions.get_mut(&(topic.to_string(), partition)) else { return };
            match counts.remove(&offset) {
                Some(count) if count > 1 => encode(counts),
                _ => return,
            }
        };
        self.commit(topic, partition, offset, metadata);
    }

    fn commit(&self, topic: &str, partition: i32, offset: i64, metadata: String) {
        if let Err(error) = self.notes.write(topic, partition, offset, metadata)
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(%error, "cannot commit record starts: crash loops are not counted");
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

    #[test]
    fn counts_survive_their_encoding_and_junk_is_ignored() {
        let counts = BTreeMap::from([(7, 1), (12, 3)]);
        assert_eq!(decode(&encode(&counts)), counts);
        assert_eq!(decode(""), BTreeMap::new());
        assert_eq!(decode("x,5:2,9:"), BTreeMap::from([(5, 2)]));
    }
}
