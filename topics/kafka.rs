//! The production bus: one Kafka topic per edge (`<prefix><topic>`), records keyed by question id,
//! each stage a consumer group. At-least-once: a record's offset is stored only once the stage
//! acknowledged it (after its outputs were acknowledged by the broker), and only in offset order per
//! partition, so a crash replays whatever was not finished. Stored offsets are committed every second,
//! before a rebalance takes partitions away, and on shutdown. A stage that is full pauses its
//! partitions and keeps polling, so it stays in its group however long the LLM takes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientContext, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::Topic;
use super::bus::{Bus, BusError, Delivery, Record, Subscription};
use crate::settings::KafkaSettings;

pub const ATTEMPT_HEADER: &str = "lacuna-attempt";
pub const QUESTION_HEADER: &str = "lacuna-question-id";

pub struct KafkaBus {
    settings: KafkaSettings,
    producer: FutureProducer,
}

fn transport(error: impl std::fmt::Display) -> BusError {
    BusError::Transport(error.to_string())
}

impl KafkaBus {
    pub fn new(settings: KafkaSettings) -> Result<Self, BusError> {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            // Retries cannot duplicate or reorder records within a partition.
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", settings.message_timeout_ms.to_string())
            .create()
            .map_err(transport)?;
        Ok(KafkaBus { settings, producer })
    }

    pub fn topic_name(&self, topic: Topic) -> String {
        format!("{}{}", self.settings.topic_prefix, topic.name())
    }

    fn topic_of(&self, name: &str) -> Option<Topic> {
        Topic::ALL.into_iter().find(|t| self.topic_name(*t) == name)
    }

    /// Creates those of `topics` that do not exist yet, with the configured partitions.
    pub async fn ensure_topics(&self, topics: &[Topic]) -> Result<(), BusError> {
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", &self.settings.brokers).create().map_err(transport)?;
        let names: Vec<String> = topics.iter().map(|t| self.topic_name(*t)).collect();
        let topics: Vec<NewTopic> = names
            .iter()
            .map(|name| {
                let topic = NewTopic::new(
                    name,
                    self.settings.partitions,
                    TopicReplication::Fixed(self.settings.replication_factor),
                );
                // A table keeps the latest record per key, whatever its age.
                if self.topic_of(name).is_some_and(Topic::is_table) {
                    topic.set("cleanup.policy", "compact")
                } else {
                    topic
                }
            })
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for result in admin.create_topics(&topics, &options).await.map_err(transport)? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => return Err(BusError::Transport(format!("cannot create topic {name}: {code}"))),
            }
        }
        Ok(())
    }

    /// Publishes with an explicit attempt number (dead-letter replay counts its attempts).
    pub async fn publish_attempt(&self, record: Record, attempt: u32) -> Result<(), BusError> {
        let name = self.topic_name(record.topic);
        let attempt = attempt.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header { key: QUESTION_HEADER, value: Some(record.key.as_bytes()) })
            .insert(Header { key: ATTEMPT_HEADER, value: Some(attempt.as_bytes()) });
        let mut future = FutureRecord::to(&name).key(record.key.as_bytes()).headers(headers);
        // An empty payload on a table is a tombstone: Kafka's null value, which compaction removes.
        if !(record.topic.is_table() && record.payload.is_empty()) {
            future = future.payload(&record.payload);
        }
        self.producer
            .send(future, Duration::from_millis(self.settings.message_timeout_ms))
            .await
            .map(|_| ())
            .map_err(|(error, _)| transport(error))
    }
}

#[async_trait]
impl Bus for KafkaBus {
    async fn publish(&self, record: Record) -> Result<(), BusError> {
        self.publish_attempt(record, 1).await
    }

    async fn subscribe(&self, topics: &[Topic], group: &str) -> Result<Box<dyn Subscription>, BusError> {
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        let lag = crate::metrics::METRICS.consumer_lag.with_label_values(&[group]);
        let context = TrackingContext { tracker: tracker.clone(), lag };
        let mut config = ClientConfig::new();
        if let Ok(debug) = std::env::var("LACUNA_KAFKA_DEBUG") {
            config.set("debug", debug);
        }
        if !self.settings.instance_id.is_empty() {
            // Unique per group: one process may consume several groups.
            config.set("group.instance.id", format!("{}.{group}", self.settings.instance_id));
        }
        let consumer: StreamConsumer<TrackingContext> = config
            .set("bootstrap.servers", &self.settings.brokers)
            .set("group.id", format!("{}{group}", self.settings.topic_prefix))
            // Offsets are stored by hand when a record is done, and committed in the background.
            .set("enable.auto.offset.store", "false")
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", self.settings.session_timeout_ms.to_string())
            .set("max.poll.interval.ms", self.settings.max_poll_interval_ms.to_string())
            // librdkafka's statistics carry each assigned partition's lag, exported as a gauge.
            .set("statistics.interval.ms", "5000")
            .create_with_context(context)
            .map_err(transport)?;
        let names: Vec<String> = topics.iter().map(|t| self.topic_name(*t)).collect();
        consumer.subscribe(&names.iter().map(String::as_str).collect::<Vec<_>>()).map_err(transport)?;
        let consumer = Arc::new(consumer);
        let topic_of: HashMap<String, Topic> =
            names.iter().filter_map(|n| Some((n.clone(), self.topic_of(n)?))).collect();
        let (sender, receiver) = mpsc::channel(self.settings.prefetch.max(1));
        let paused = crate::metrics::METRICS.paused_partitions.with_label_values(&[group]);
        let poller = tokio::spawn(poll(consumer.clone(), tracker, topic_of, sender, paused));
        Ok(Box::new(KafkaSubscription { receiver, consumer, poller }))
    }

    async fn read_table(&self, topic: Topic) -> Result<Vec<Record>, BusError> {
        let (brokers, name) = (self.settings.brokers.clone(), self.topic_name(topic));
        tokio::task::spawn_blocking(move || read_whole_topic(&brokers, &name, topic)).await.map_err(transport)?
    }
}

/// Reads every partition of `name` from its beginning to its current end, outside any consumer group,
/// keeping the latest record per key.
fn read_whole_topic(brokers: &str, name: &str, topic: Topic) -> Result<Vec<Record>, BusError> {
    let timeout = Duration::from_secs(10);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "lacuna-table-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(transport)?;
    let metadata = consumer.fetch_metadata(Some(name), timeout).map_err(transport)?;
    let mut ends = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
        let (low, high) = consumer.fetch_watermarks(name, partition.id(), timeout).map_err(transport)?;
        if high > low {
            ends.insert(partition.id(), high);
            assignment.add_partition_offset(name, partition.id(), Offset::Beginning).map_err(transport)?;
        }
    }
    let mut table: HashMap<String, (usize, Vec<u8>)> = HashMap::new();
    let mut read = 0;
    if !ends.is_empty() {
        consumer.assign(&assignment).map_err(transport)?;
    }
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    while !ends.is_empty() {
        if std::time::Instant::now() > give_up {
            return Err(BusError::Transport(format!("reading table {name} timed out")));
        }
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                ends.remove(&partition);
            }
            Some(Err(error)) => return Err(transport(error)),
            Some(Ok(message)) => {
                let key = message.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
                match message.payload() {
                    Some(payload) if !payload.is_empty() => {
                        read += 1;
                        table.insert(key, (read, payload.to_vec()));
                    }
                    _ => {
                        table.remove(&key);
                    }
                }
                if ends.get(&message.partition()).is_some_and(|end| message.offset() + 1 >= *end) {
                    ends.remove(&message.partition());
                }
            }
        }
    }
    let mut records: Vec<_> = table.into_iter().collect();
    records.sort_by_key(|(_, (order, _))| *order);
    Ok(records.into_iter().map(|(key, (_, payload))| Record { topic, key, payload }).collect())
}

/// Which offsets of each partition are in flight, and which of them are done.
#[derive(Default)]
struct OffsetTracker {
    /// Bumped when partitions are revoked: acknowledgements of older deliveries are then ignored.
    generation: u64,
    in_flight: HashMap<(String, i32), BTreeMap<i64, bool>>,
}

impl OffsetTracker {
    fn register(&mut self, topic: &str, partition: i32, offset: i64) -> u64 {
        self.in_flight.entry((topic.to_string(), partition)).or_default().insert(offset, false);
        self.generation
    }

    /// Marks an offset done; returns the offset to store when the partition's lowest offsets are done.
    fn ack(&mut self, topic: &str, partition: i32, offset: i64, generation: u64) -> Option<i64> {
        if generation != self.generation {
            return None;
        }
        let offsets = self.in_flight.get_mut(&(topic.to_string(), partition))?;
        offsets.insert(offset, true);
        let mut next = None;
        while let Some((&lowest, &done)) = offsets.iter().next() {
            if !done {
                break;
            }
            offsets.remove(&lowest);
            next = Some(lowest + 1);
        }
        next
    }

    fn reset(&mut self) {
        self.generation += 1;
        self.in_flight.clear();
    }
}

struct TrackingContext {
    tracker: Arc<Mutex<OffsetTracker>>,
    /// Records behind the end of the partitions this consumer holds.
    lag: prometheus::IntGauge,
}

impl ClientContext for TrackingContext {
    // librdkafka's own log lines (set `debug` through LACUNA_KAFKA_DEBUG, e.g. "cgrp") go to tracing.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel::*;
        match level {
            Emerg | Alert | Critical | Error => tracing::error!(target: "librdkafka", facility, "{message}"),
            Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            Notice | Info => tracing::info!(target: "librdkafka", facility, "{message}"),
            Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        // -1 means unknown (not yet fetched); partition -1 is librdkafka's internal "unassigned" one.
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|topic| topic.partitions.iter())
            .filter(|(id, partition)| **id >= 0 && partition.consumer_lag >= 0)
            .map(|(_, partition)| partition.consumer_lag)
            .sum();
        self.lag.set(lag);
    }
}

impl ConsumerContext for TrackingContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(_) = rebalance {
            // Commit what is done before the partitions move, and forget the rest: the new owner
            // will see it again (at-least-once).
            if let Err(error) = consumer.commit_consumer_state(CommitMode::Sync) {
                if !is_no_offset(&error) {
                    tracing::warn!(%error, "commit before rebalance failed");
                }
            }
            self.tracker.lock().unwrap().reset();
        }
    }
}

fn is_no_offset(error: &KafkaError) -> bool {
    matches!(error, KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset))
}

pub struct KafkaSubscription {
    receiver: mpsc::Receiver<Delivery>,
    consumer: Arc<StreamConsumer<TrackingContext>>,
    poller: tokio::task::JoinHandle<()>,
}

impl Drop for KafkaSubscription {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

#[async_trait]
impl Subscription for KafkaSubscription {
    async fn next(&mut self) -> Option<Delivery> {
        self.receiver.recv().await
    }

    async fn commit(&mut self) -> Result<(), BusError> {
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || match consumer.commit_consumer_state(CommitMode::Sync) {
            Err(error) if !is_no_offset(&error) => Err(transport(error)),
            _ => Ok(()),
        })
        .await
        .map_err(transport)?
    }
}

/// Polls the consumer for as long as the subscription lives. Records go to a bounded channel; when
/// the stage does not take them, the assigned partitions are paused (what was already fetched waits
/// in a small queue) and polling goes on, which keeps the consumer in its group.
async fn poll(
    consumer: Arc<StreamConsumer<TrackingContext>>,
    tracker: Arc<Mutex<OffsetTracker>>,
    topic_of: HashMap<String, Topic>,
    sender: mpsc::Sender<Delivery>,
    paused_gauge: prometheus::IntGauge,
) {
    let mut waiting: VecDeque<Delivery> = VecDeque::new();
    let mut paused = false;
    loop {
        if let Some(delivery) = waiting.pop_front() {
            match sender.try_send(delivery) {
                Ok(()) => continue,
                Err(mpsc::error::TrySendError::Closed(_)) => return,
                Err(mpsc::error::TrySendError::Full(delivery)) => waiting.push_front(delivery),
            }
            if !paused {
                paused_gauge.set(set_paused(&consumer, true));
                paused = true;
            }
            tokio::select! {
                permit = sender.reserve() => match permit {
                    Ok(permit) => permit.send(waiting.pop_front().expect("a waiting delivery")),
                    Err(_) => return,
                },
                message = consumer.recv() => waiting.extend(to_delivery(&consumer, &tracker, &topic_of, message)),
            }
            continue;
        }
        if paused {
            set_paused(&consumer, false);
            paused_gauge.set(0);
            paused = false;
        }
        tokio::select! {
            message = consumer.recv() => waiting.extend(to_delivery(&consumer, &tracker, &topic_of, message)),
            _ = sender.closed() => return,
        }
    }
}

/// Pauses or resumes every assigned partition; returns how many there are.
fn set_paused(consumer: &StreamConsumer<TrackingContext>, pause: bool) -> i64 {
    let Ok(assignment) = consumer.assignment() else { return 0 };
    let outcome = if pause { consumer.pause(&assignment) } else { consumer.resume(&assignment) };
    if let Err(error) = outcome {
        tracing::warn!(%error, pause, "cannot pause or resume partitions");
    }
    assignment.count() as i64
}

fn to_delivery(
    consumer: &Arc<StreamConsumer<TrackingContext>>,
    tracker: &Arc<Mutex<OffsetTracker>>,
    topic_of: &HashMap<String, Topic>,
    message: Result<rdkafka::message::BorrowedMessage<'_>, KafkaError>,
) -> Option<Delivery> {
    let message = match message {
        Ok(message) => message,
        Err(error) => {
            tracing::warn!(%error, "kafka consumer error");
            return None;
        }
    };
    let (name, partition, offset) = (message.topic().to_string(), message.partition(), message.offset());
    let topic = *topic_of.get(&name)?;
    let key = message.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
    let attempt = message
        .headers()
        .and_then(|headers| headers.iter().find(|h| h.key == ATTEMPT_HEADER))
        .and_then(|h| std::str::from_utf8(h.value?).ok()?.parse().ok())
        .unwrap_or(1);
    let payload = message.payload().unwrap_or_default().to_vec();
    let generation = tracker.lock().unwrap().register(&name, partition, offset);
    let (consumer, tracker) = (consumer.clone(), tracker.clone());
    let ack = Box::new(move || {
        let store = tracker.lock().unwrap().ack(&name, partition, offset, generation);
        if let Some(next) = store {
            if let Err(error) = consumer.store_offset(&name, partition, next - 1) {
                tracing::debug!(%error, "offset not stored (partition moved away)");
            }
        }
    });
    Some(Delivery::new(Record { topic, key, payload }, attempt, Some(ack)))
}

#[cfg(test)]
mod tests {
    use super::OffsetTracker;

    #[test]
    fn offsets_are_stored_in_order_per_partition() {
        let mut tracker = OffsetTracker::default();
        let generation = (0..3).map(|o| tracker.register("t", 0, o)).last().unwrap();
        assert_eq!(tracker.ack("t", 0, 2, generation), None, "offset 2 waits for 0 and 1");
        assert_eq!(tracker.ack("t", 0, 0, generation), Some(1));
        assert_eq!(tracker.ack("t", 0, 1, generation), Some(3), "1 done: everything through 2 is done");
    }

    #[test]
    fn acks_from_before_a_rebalance_are_ignored() {
        let mut tracker = OffsetTracker::default();
        let generation = tracker.register("t", 0, 5);
        tracker.reset();
        assert_eq!(tracker.ack("t", 0, 5, generation), None);
    }
}
