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
use super::bus::{Bus, BusError, Delivery, DeliveryHooks, Record, Subscription};
use crate::settings::{BusSettings, KafkaSettings};

pub const ATTEMPT_HEADER: &str = "lacuna-attempt";
pub const QUESTION_HEADER: &str = "lacuna-question-id";

pub struct KafkaBus {
    settings: KafkaSettings,
    /// Brokers and the user's properties and secrets: every client starts from it.
    base: ClientConfig,
    producer: FutureProducer,
    /// `bus.write_schema_version`; 0 for this build's.
    write_schema_version: u32,
}

fn transport(error: impl std::fmt::Display) -> BusError {
    BusError::Transport(error.to_string())
}

/// Errors no retry can fix are rejections; the rest (timeouts, leader changes, a broker away) are
/// transient.
fn publish_error(error: KafkaError) -> BusError {
    use RDKafkaErrorCode::*;
    match error.rdkafka_error_code() {
        Some(
            MessageSizeTooLarge
            | InvalidMessageSize
            | MessageBatchTooLarge
            | InvalidMessage
            | InvalidRecord
            | UnknownTopic
            | UnknownTopicOrPartition
            | InvalidTopic
            | TopicAuthorizationFailed
            | ClusterAuthorizationFailed
            | TransactionalIdAuthorizationFailed,
        ) => BusError::Rejected(error.to_string()),
        _ => transport(error),
    }
}

impl KafkaBus {
    pub fn new(settings: KafkaSettings, bus: &BusSettings) -> Result<Self, BusError> {
        let max_event_bytes = bus.max_event_bytes;
        let base = super::kafka_config::client_config(&settings)?;
        let producer: FutureProducer = base
            .clone()
            // Retries cannot duplicate or reorder records within a partition.
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", settings.message_timeout_ms.to_string())
            // Stages trim events to bus.max_event_bytes; the room above it is for key and headers.
            .set("message.max.bytes", (max_event_bytes + 64 * 1024).to_string())
            .create()
            .map_err(transport)?;
        Ok(KafkaBus { settings, base, producer, write_schema_version: bus.write_schema_version })
    }

    pub fn topic_name(&self, topic: Topic) -> String {
        format!("{}{}", self.settings.topic_prefix, topic.name())
    }

    fn topic_of(&self, name: &str) -> Option<Topic> {
        Topic::ALL.into_iter().find(|t| self.topic_name(*t) == name)
    }

    /// Creates those of `topics` that do not exist yet, with the configured partitions.
    pub async fn ensure_topics(&self, topics: &[Topic]) -> Result<(), BusError> {
        let admin: AdminClient<DefaultClientContext> = self.base.create().map_err(transport)?;
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
        let payload = match self.write_schema_version {
            0 => record.payload,
            version => super::schema::write_as(record.payload, version),
        };
        let mut future = FutureRecord::to(&name).key(record.key.as_bytes()).headers(headers);
        // An empty payload on a table is a tombstone: Kafka's null value, which compaction removes.
        if !(record.topic.is_table() && payload.is_empty()) {
            future = future.payload(&payload);
        }
        self.producer
            .send(future, Duration::from_millis(self.settings.message_timeout_ms))
            .await
            .map(|_| ())
            .map_err(|(error, _)| publish_error(error))
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
        let drain_timeout = Duration::from_millis(self.settings.drain_timeout_ms);
        let context = TrackingContext { tracker: tracker.clone(), drain_timeout, lag };
        let mut config = self.base.clone();
        if let Ok(debug) = std::env::var("LACUNA_KAFKA_DEBUG") {
            config.set("debug", debug);
        }
        if !self.settings.instance_id.is_empty() {
            // Unique per group: one process may consume several groups.
            config.set("group.instance.id", format!("{}.{group}", self.settings.instance_id));
        }
        let consumer: StreamConsumer<TrackingContext> = config
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
        // A thread of its own: a revocation blocks the poll that serves it while the revoked
        // partitions' work drains (up to kafka.drain_timeout_ms), and on a shared runtime that would
        // stall every other task there, other stages' pollers included, past max.poll.interval.ms.
        let polled = consumer.clone();
        std::thread::Builder::new()
            .name(format!("poll-{group}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                match runtime {
                    Ok(runtime) => runtime.block_on(poll(polled, tracker, topic_of, sender, paused)),
                    // Dropping the sender ends the feed: the stage fails and says so.
                    Err(error) => tracing::error!(%error, "cannot start the Kafka poller's runtime"),
                }
            })
            .map_err(transport)?;
        Ok(Box::new(KafkaSubscription { receiver, consumer }))
    }

    async fn read_table(&self, topic: Topic) -> Result<Vec<Record>, BusError> {
        let (base, name) = (self.base.clone(), self.topic_name(topic));
        // Never joined nor committed (partitions are assigned by hand), but named under the prefix
        // like every group, for ACLs that grant groups by prefix.
        let group = format!("{}table-reader", self.settings.topic_prefix);
        tokio::task::spawn_blocking(move || read_whole_topic(base, &group, &name, topic)).await.map_err(transport)?
    }
}

/// Reads every partition of `name` from its beginning to its current end, outside any consumer group,
/// keeping the latest record per key.
fn read_whole_topic(mut base: ClientConfig, group: &str, name: &str, topic: Topic) -> Result<Vec<Record>, BusError> {
    let timeout = Duration::from_secs(10);
    let consumer: BaseConsumer = base
        .set("group.id", group)
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

/// Where each fetched offset of a partition stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Progress {
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
struct OffsetTracker {
    partitions: HashMap<(String, i32), Partition>,
    /// Never reused: a partition revoked and assigned back starts a generation no older delivery has.
    next_generation: u64,
}

#[derive(Default)]
struct Partition {
    /// Acknowledgements and claims of deliveries from another generation are ignored.
    generation: u64,
    offsets: BTreeMap<i64, Progress>,
}

impl OffsetTracker {
    fn partition(&mut self, topic: &str, partition: i32) -> &mut Partition {
        let next = &mut self.next_generation;
        self.partitions.entry((topic.to_string(), partition)).or_insert_with(|| {
            *next += 1;
            Partition { generation: *next, offsets: BTreeMap::new() }
        })
    }

    fn register(&mut self, topic: &str, partition: i32, offset: i64) -> u64 {
        let partition = self.partition(topic, partition);
        partition.offsets.insert(offset, Progress::Fetched);
        partition.generation
    }

    /// The stage takes the offset on; false when its partition was revoked since it was fetched.
    fn claim(&mut self, topic: &str, partition: i32, offset: i64, generation: u64) -> bool {
        match self.partitions.get_mut(&(topic.to_string(), partition)) {
            Some(p) if p.generation == generation && p.offsets.contains_key(&offset) => {
                p.offsets.insert(offset, Progress::Started);
                true
            }
            _ => false,
        }
    }

    /// Marks an offset done; returns the offset to store when the partition's lowest offsets are done.
    fn ack(&mut self, topic: &str, partition: i32, offset: i64, generation: u64) -> Option<i64> {
        let partition = self.partitions.get_mut(&(topic.to_string(), partition))?;
        if partition.generation != generation {
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
        next
    }

    /// Offsets of these partitions the stage is working on.
    fn started(&self, partitions: &[(String, i32)]) -> usize {
        partitions
            .iter()
            .filter_map(|key| self.partitions.get(key))
            .map(|p| p.offsets.values().filter(|progress| **progress == Progress::Started).count())
            .sum()
    }

    /// Forgets these partitions: what is still fetched or unfinished there is their next owner's.
    fn revoke(&mut self, partitions: &[(String, i32)]) {
        for key in partitions {
            self.partitions.remove(key);
        }
    }
}

struct TrackingContext {
    tracker: Arc<Mutex<OffsetTracker>>,
    /// How long a revocation waits for the revoked partitions' started work.
    drain_timeout: Duration,
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
        let Rebalance::Revoke(revoked) = rebalance else { return };
        let partitions: Vec<(String, i32)> =
            revoked.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
        // Let the work already started on the revoked partitions finish and be acknowledged, so
        // their new owner starts after it instead of doing it again. This holds up the rebalance,
        // hence the bound (keep it under max.poll.interval.ms).
        let started = std::time::Instant::now();
        loop {
            let in_flight = self.tracker.lock().unwrap().started(&partitions);
            if in_flight == 0 {
                break;
            }
            if started.elapsed() >= self.drain_timeout {
                tracing::warn!(in_flight, "rebalance: kafka.drain_timeout_ms passed; the new owner redoes the rest");
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Err(error) = consumer.commit_consumer_state(CommitMode::Sync)
            && !is_no_offset(&error)
        {
            tracing::warn!(%error, "commit before rebalance failed");
        }
        tracing::info!(
            partitions = partitions.len(),
            waited_ms = started.elapsed().as_millis() as u64,
            "partitions revoked"
        );
        self.tracker.lock().unwrap().revoke(&partitions);
    }
}

fn is_no_offset(error: &KafkaError) -> bool {
    matches!(error, KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset))
}

/// Dropping it closes the channel its poller thread feeds, which ends that thread.
pub struct KafkaSubscription {
    receiver: mpsc::Receiver<Delivery>,
    consumer: Arc<StreamConsumer<TrackingContext>>,
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
    let (consumer, claim_tracker, tracker, claim_name) =
        (consumer.clone(), tracker.clone(), tracker.clone(), name.clone());
    let claim = Box::new(move || claim_tracker.lock().unwrap().claim(&claim_name, partition, offset, generation));
    let ack = Box::new(move || {
        let store = tracker.lock().unwrap().ack(&name, partition, offset, generation);
        if let Some(next) = store
            && let Err(error) = consumer.store_offset(&name, partition, next - 1)
        {
            tracing::debug!(%error, "offset not stored (partition moved away)");
        }
    });
    Some(Delivery::new(Record { topic, key, payload }, attempt, Some(DeliveryHooks { claim, ack })))
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
    fn a_revocation_forgets_only_its_partitions() {
        let mut tracker = OffsetTracker::default();
        let (kept, revoked) = (tracker.register("t", 0, 5), tracker.register("t", 1, 7));
        assert!(tracker.claim("t", 0, 5, kept) && tracker.claim("t", 1, 7, revoked));
        assert_eq!(tracker.started(&[("t".into(), 1)]), 1, "a revocation waits for this one");
        tracker.revoke(&[("t".into(), 1)]);
        assert_eq!(tracker.ack("t", 1, 7, revoked), None, "a revoked partition's late ack is ignored");
        assert_eq!(tracker.ack("t", 0, 5, kept), Some(6), "the other partition carries on");
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
