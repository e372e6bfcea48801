//! Following topics from a point in time, outside any consumer group's rebalancing: how a `lacuna
//! serve` replica reads every answer and progress partition. A new replica starts
//! `serve.replay_window_s` back rather than at the earliest offset, which would replay whole topics
//! into its memory, and it knows when it has read up to the end offsets the topics had when it
//! started: until then it is not ready.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use super::catch_up::CatchUp;
use super::leaders;
use super::rebalance::TrackingContext;
use super::wire::transport;
use super::{Feeding, KafkaBus};
use crate::topics::Topic;
use crate::topics::bus::{BusError, Subscription};

impl KafkaBus {
    /// Every partition of `topics` from the first record at or after `since` (from their end where
    /// there is none), never committed: a replica's reading position lives and dies with it. The
    /// watch turns true once the records that were there at the start are all acknowledged. One
    /// topic a follower: the broker reports a partition's end by its number alone.
    pub async fn follow_since(
        &self,
        topics: &[Topic],
        group: &str,
        since: SystemTime,
    ) -> Result<(Box<dyn Subscription>, watch::Receiver<bool>), BusError> {
        let [topic] = topics else {
            return Err(BusError::Config(format!("a follower reads one topic, not {}", topics.len())));
        };
        let (consumer, tracker) = self.consumer(group, false, None, None)?;
        let names = vec![self.topic_name(*topic)];
        let since_ms = since.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let (consumer, start, ends) = {
            let names = names.clone();
            tokio::task::spawn_blocking(move || {
                starting_points(&consumer, &names, since_ms).map(|(start, ends)| (consumer, start, ends))
            })
            .await
            .map_err(transport)??
        };
        consumer.assign(&start).map_err(transport)?;
        let behind = ends.len();
        let catch_up = CatchUp::new(ends);
        let caught_up = catch_up.done.subscribe();
        tracing::info!(group, since_ms, partitions_behind = behind, "following from the replay window");
        let feed = self.feed(consumer, tracker, &names, group, Feeding::Follower(catch_up), None, None)?;
        Ok((feed, caught_up))
    }
}

/// Where to start each partition of `names` (the first offset at or after `since_ms`), and the end
/// offset of each that has records to read from there.
fn starting_points(
    consumer: &StreamConsumer<TrackingContext>,
    names: &[String],
    since_ms: i64,
) -> Result<(TopicPartitionList, HashMap<(String, i32), i64>), BusError> {
    let timeout = Duration::from_secs(10);
    let mut at_time = TopicPartitionList::new();
    // Each end is read before the offsets by time: a transaction committed in between (its records
    // not yet below the stable offset when asked by time) is then read from the end, not skipped.
    let mut highs = HashMap::new();
    for name in names {
        for partition in leaders::partitions(consumer, name, timeout)? {
            at_time.add_partition_offset(name, partition, Offset::Offset(since_ms)).map_err(transport)?;
            highs.insert((name.clone(), partition), leaders::watermarks(consumer, name, partition, timeout)?.1);
        }
    }
    let found = leaders::offsets_for_times(consumer, at_time, timeout)?;
    let (mut start, mut ends) = (TopicPartitionList::new(), HashMap::new());
    for element in found.elements() {
        let (name, partition) = (element.topic(), element.partition());
        let high = highs.get(&(name.to_string(), partition)).copied().unwrap_or_default();
        // No record at or after the time: nothing of the window there; read what comes next.
        let from = match element.offset() {
            Offset::Offset(offset) => offset.min(high),
            _ => high,
        };
        if from < high {
            ends.insert((name.to_string(), partition), high);
        }
        start.add_partition_offset(name, partition, Offset::Offset(from)).map_err(transport)?;
    }
    Ok((start, ends))
}
