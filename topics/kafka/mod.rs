//! The production bus: one Kafka topic per edge (`<prefix><topic>`), records keyed by question id,
//! each stage a consumer group. At-least-once: a record's offset is stored only once the stage
//! acknowledged it (after its outputs were acknowledged by the broker), and only in offset order per
//! partition, so a crash replays whatever was not finished. Stored offsets are committed every second,
//! before a rebalance takes partitions away, and on shutdown. A stage that is full pauses its
//! partitions and keeps polling, so it stays in its group however long the LLM takes. With
//! `bus.delivery = "exactly_once"`, a stage process's outputs and positions are committed together
//! in Kafka transactions instead (`transactions`).
//!
//! - `config`: the librdkafka configuration every client starts from: brokers, properties, secrets.
//! - `poller`: the consumer's poller and a stage's subscription; a full channel pauses the partitions.
//! - `offsets`: which offsets are done, so each is stored only after all before it (in order).
//! - `claims`: each record's starts, kept on the broker, so one that keeps crashing its stage is ended.
//! - `rebalance`: the consumer context: drains and commits before a revocation; logs and statistics.
//! - `fenced`: a member's consumer fenced by its own rejoin (librdkafka#3437), made anew in place.
//! - `table`: a compacted topic read whole, outside any group (how the join reads its state back).
//! - `follow`: topics followed from a point in time, outside any group (a serve replica's answers).
//! - `leaders`: a topic's partitions, watermarks and offsets by time, asked again while leaders are elected.
//! - `documents`: the corpus's changelog: one compacted documents topic, a record per whole document.
//! - `identity`: the cluster's and a topic's ids, kept beside offsets stored outside Kafka.
//! - `grants`: which of the ACLs a process needs the cluster's authorizer does not grant it.
//! - `catch_up`: how far a follower has read of the end offsets it must reach before it is ready.
//! - `transactions`: exactly-once: a process's outputs and consumed positions in one transaction.
//! - `carried`: exactly-once: what each commit carries of a consumer (positions, done offsets, group).
//! - `settle`: exactly-once: a producer's transactions initialised, and an id left behind settled.
//! - `done_ledger`: exactly-once: the offsets done beyond a committed position, in its metadata.
//! - `gate`: what a commit closes: events hold passes, a commit waits for them; every hold timed.
//! - `lineage`: exactly-once across a replica's restarts: a transactional id per process, the last one kept.
//! - `wire`: what every file here shares: our records' headers, librdkafka errors as `BusError`s, and
//!   notes kept on the broker as committed offsets' metadata.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::sync::mpsc;

mod carried;
mod catch_up;
mod claims;
mod config;
mod documents;
mod done_ledger;
mod fenced;
mod follow;
mod gate;
mod grants;
mod identity;
mod leaders;
mod lineage;
mod offsets;
mod poller;
mod rebalance;
mod settle;
mod table;
mod transactions;
mod wire;

use carried::Tracked;
pub use catch_up::CatchUp;
pub use config::client_config;
pub use documents::{Change, Changelog, RejectedDocument, Span};
use done_ledger::DoneBefore;
pub use grants::Acl;
pub use identity::TopicIdentity;
use lineage::Lineage;
use offsets::OffsetTracker;
use poller::{KafkaSubscription, Refusals, Shared, poll};
use rebalance::TrackingContext;
use table::read_whole_topic;
use transactions::Transactions;
pub use wire::{ATTEMPT_HEADER, QUESTION_HEADER, TRACEPARENT_HEADER, TRACESTATE_HEADER};
use wire::{publish_error, transport};

use super::Topic;
use super::bus::{Bus, BusError, Hold, Record, Subscription, Transaction};
use crate::config::{BusSettings, DeliveryGuarantee, KafkaSettings};

/// How long reading a topic's identity may take, leaders' elections included.
const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct KafkaBus {
    settings: KafkaSettings,
    max_event_bytes: usize,
    /// Brokers and the user's properties and secrets: every client starts from it.
    base: ClientConfig,
    /// The producer, and how many were made before it: one hit by a fatal error is replaced.
    producer: std::sync::RwLock<(u64, FutureProducer)>,
    /// `bus.write_schema_version`; 0 for this build's.
    write_schema_version: u32,
    /// `bus.delivery = "exactly_once"`.
    exactly_once: bool,
    /// Exactly-once: the transactional producer, made when the process first joins a group.
    transactions: std::sync::OnceLock<Arc<Transactions>>,
    /// The stages of this process that keep state in memory, which an aborted transaction's rewind
    /// cannot take back.
    stateful: transactions::Stateful,
}

/// The producer every publish goes through: idempotent (retries cannot duplicate or reorder records
/// within a partition), acknowledged by every in-sync replica.
/// With `transactional`, its id and transaction timeout: the exactly-once producer.
fn producer(
    base: &ClientConfig,
    settings: &KafkaSettings,
    max_event_bytes: usize,
    transactional: Option<(&str, Duration)>,
) -> Result<FutureProducer, BusError> {
    let mut config = base.clone();
    let mut message_timeout = settings.message_timeout_ms;
    if let Some((id, timeout)) = transactional {
        config.set("transactional.id", id).set("transaction.timeout.ms", timeout.as_millis().to_string());
        // librdkafka: a record may not outlive the transaction it is in; and its delivery, a hold
        // inside that transaction, takes at most half of it (gate::hold_budget).
        message_timeout = message_timeout.min(gate::hold_budget(timeout).as_millis() as u64);
    }
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", message_timeout.to_string())
        // Stages trim events to bus.max_event_bytes; the room above it is for key and headers.
        .set("message.max.bytes", (max_event_bytes + 64 * 1024).to_string())
        .create()
        .map_err(transport)
}

/// Settles the transactions written under `id` ([`settle::settle`]): what a crashed
/// predecessor left (`succeed`) and a producer left behind (`renew`).
fn settle(
    base: &ClientConfig,
    settings: &KafkaSettings,
    max_event_bytes: usize,
    id: &str,
    timeout: Duration,
) -> Result<(), BusError> {
    let settling = producer(base, settings, max_event_bytes, Some((id, timeout)))?;
    settle::settle(&settling, id, timeout)
}

impl KafkaBus {
    pub fn new(settings: KafkaSettings, bus: &BusSettings) -> Result<Self, BusError> {
        // Only Kafka carries records to other builds, so only it checks the version it is to write.
        if bus.write_schema_version != 0 {
            super::schema::check_write_version(bus.write_schema_version).map_err(BusError::Config)?;
        }
        let base = client_config(&settings)?;
        let producer = producer(&base, &settings, bus.max_event_bytes, None)?;
        Ok(KafkaBus {
            settings,
            base,
            producer: std::sync::RwLock::new((0, producer)),
            max_event_bytes: bus.max_event_bytes,
            write_schema_version: bus.write_schema_version,
            exactly_once: bus.delivery == DeliveryGuarantee::ExactlyOnce,
            transactions: std::sync::OnceLock::new(),
            stateful: Default::default(),
        })
    }

    /// The process's transactions, begun on first use (exactly-once only). Where `kafka.instance_id`
    /// names the replica, its restart aborts what it left open at once (see `lineage`); otherwise
    /// the broker does after `kafka.transaction_timeout_ms`. `topic` is the first one it reads.
    fn transactions(&self, group: &str, topic: &str) -> Result<Option<Arc<Transactions>>, BusError> {
        if !self.exactly_once {
            return Ok(None);
        }
        if let Some(transactions) = self.transactions.get() {
            return Ok(Some(transactions.clone()));
        }
        let timeout = Duration::from_millis(self.settings.transaction_timeout_ms);
        let id = match self.settings.instance_id.as_str() {
            "" => lineage::fresh_id(&format!("{}{group}.{}", self.settings.topic_prefix, std::process::id())),
            instance => self.succeed(&format!("{}{group}.{instance}", self.settings.topic_prefix), topic, timeout)?,
        };
        let producer = producer(&self.base, &self.settings, self.max_event_bytes, Some((&id, timeout)))?;
        let interval = Duration::from_millis(self.settings.transaction_interval_ms);
        let renew = self.renew(group, topic);
        let started = Transactions::start((id.clone(), producer), (renew, self.stateful.clone()), interval, timeout)?;
        tracing::info!(transactional_id = %id, "exactly-once: transactional producer ready");
        Ok(Some(self.transactions.get_or_init(|| started).clone()))
    }

    /// How the process's transactional producer is replaced after it was fenced, hit a fatal error
    /// or could not abort: the id it leaves is settled first (re-initialised: a commit under way
    /// finishes, an open transaction is aborted), before a new id is kept in the replica's lineage
    /// (where `kafka.instance_id` names it); then a producer under the new id, initialised.
    fn renew(&self, group: &str, topic: &str) -> transactions::Renew {
        let (base, settings, max_event_bytes) = (self.base.clone(), self.settings.clone(), self.max_event_bytes);
        let (group, topic) = (group.to_string(), topic.to_string());
        Box::new(move |left| {
            let timeout = Duration::from_millis(settings.transaction_timeout_ms);
            settle(&base, &settings, max_event_bytes, left, timeout)?;
            let id = match settings.instance_id.as_str() {
                "" => lineage::fresh_id(&format!("{}{group}.{}", settings.topic_prefix, std::process::id())),
                instance => {
                    let lineage = Lineage::new(&base, &format!("{}{group}.{instance}", settings.topic_prefix), &topic)?;
                    let id = lineage::fresh_id(&format!("{}{group}.{instance}", settings.topic_prefix));
                    lineage.record(&id)?;
                    id
                }
            };
            let fresh = producer(&base, &settings, max_event_bytes, Some((&id, timeout)))?;
            settle::init_transactions(&fresh, timeout)?;
            tracing::warn!(transactional_id = %id, left, "exactly-once: a new transactional producer replaces the one that failed");
            Ok((id, fresh))
        })
    }

    /// A new transactional id for this process of the replica whose ids start with `stable`, kept
    /// on the broker before its first use, once what the replica's last process left open is
    /// aborted (re-initialising its id fences that process too, should it still run). Builds before
    /// this one wrote under `stable` itself: that is the last id where none is kept.
    fn succeed(&self, stable: &str, topic: &str, timeout: Duration) -> Result<String, BusError> {
        let lineage = Lineage::new(&self.base, stable, topic)?;
        let last = lineage.last()?.unwrap_or_else(|| stable.to_string());
        let started = std::time::Instant::now();
        settle(&self.base, &self.settings, self.max_event_bytes, &last, timeout)?;
        let took_ms = started.elapsed().as_millis() as u64;
        tracing::debug!(transactional_id = %last, took_ms, "settled what the replica's last process left");
        let id = lineage::fresh_id(stable);
        lineage.record(&id)?;
        Ok(id)
    }

    /// Replaces producer number `broken` after a fatal error (librdkafka: the instance can never
    /// send again; a broker that restarted and forgot the idempotent producer's sequence numbers
    /// causes one). The records it held are failed to their callers, whose retries go out on the new
    /// one; idempotence holds within each producer, so a retried record may be written twice, which
    /// at-least-once delivery allows and the stages skip.
    fn renew_producer(&self, broken: u64) {
        let mut current = self.producer.write().unwrap();
        if current.0 != broken {
            return; // another publish renewed it already
        }
        let reason = current.1.client().fatal_error().map(|(code, reason)| format!("{code:?}: {reason}"));
        match producer(&self.base, &self.settings, self.max_event_bytes, None) {
            Ok(fresh) => {
                tracing::error!(
                    reason = reason.as_deref().unwrap_or("unknown"),
                    "Kafka producer hit a fatal error: replaced"
                );
                crate::metrics::METRICS.producer_renewals.with_label_values::<&str>(&[]).inc();
                *current = (broken + 1, fresh);
            }
            Err(error) => tracing::error!(%error, "Kafka producer hit a fatal error and cannot be replaced"),
        }
    }

    /// The identity of the topic named `name` (as [`Self::topic_name`] gives it): what positions
    /// stored outside Kafka are kept with, to be compared before they are used again.
    pub async fn identify(&self, name: &str) -> Result<TopicIdentity, BusError> {
        let consumer: rdkafka::consumer::BaseConsumer = self.base.create().map_err(transport)?;
        let name = name.to_string();
        tokio::task::spawn_blocking(move || identity::identify(consumer.client(), &name, IDENTIFY_TIMEOUT))
            .await
            .map_err(transport)?
    }

    /// Of `needed`, the topic and group rules the cluster's authorizer does not grant this
    /// client's principal ([`grants`]).
    /// A transactional id rule has no such question: it is asked by initialising a producer under
    /// `<name>acl-check` (a prefixed rule's name ends with its `.`), as exactly-once initialises its own.
    pub async fn missing_acls(&self, needed: Vec<Acl>) -> Result<Vec<Acl>, BusError> {
        let consumer: rdkafka::consumer::BaseConsumer = self.base.create().map_err(transport)?;
        let (base, settings, max_event_bytes) = (self.base.clone(), self.settings.clone(), self.max_event_bytes);
        let timeout = Duration::from_millis(self.settings.transaction_timeout_ms);
        tokio::task::spawn_blocking(move || {
            let mut missing = grants::missing(consumer.client(), &needed, IDENTIFY_TIMEOUT)?;
            for acl in needed.iter().filter(|acl| acl.resource == "TRANSACTIONAL_ID") {
                let id = if acl.pattern == "PREFIXED" { format!("{}acl-check", acl.name) } else { acl.name.clone() };
                let probe = producer(&base, &settings, max_event_bytes, Some((&id, timeout)))?;
                match probe.init_transactions(timeout) {
                    Err(error)
                        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed) =>
                    {
                        missing.push(acl.clone())
                    }
                    Err(error) => return Err(transport(error)),
                    Ok(()) => {}
                }
            }
            Ok(missing)
        })
        .await
        .map_err(transport)?
    }

    /// [`Self::identify`], blocking the calling thread (a follower's own).
    pub fn identify_blocking(&self, name: &str) -> Result<TopicIdentity, BusError> {
        let consumer: rdkafka::consumer::BaseConsumer = self.base.create().map_err(transport)?;
        identity::identify(consumer.client(), name, IDENTIFY_TIMEOUT)
    }

    pub fn topic_name(&self, topic: Topic) -> String {
        format!("{}{}", self.settings.topic_prefix, topic.name())
    }

    fn topic_of(&self, name: &str) -> Option<Topic> {
        Topic::ALL.into_iter().find(|t| self.topic_name(*t) == name)
    }

    /// Creates those of `topics` that do not exist yet, with the configured partitions (see
    /// [`Self::create_unseen`]).
    pub async fn ensure_topics(&self, topics: &[Topic]) -> Result<(), BusError> {
        let names = topics.iter().map(|t| self.topic_name(*t)).collect();
        // A table keeps the latest record per key, whatever its age.
        self.create_unseen(names, |name| self.topic_of(name).is_some_and(Topic::is_table)).await
    }

    /// Creates those of `names` that this client does not see, with the configured partitions,
    /// compacted where `compacted` says. Only those are asked for: under an authorizer a process
    /// may describe the topics it uses but not create them, and Kafka refuses to create one it may
    /// not, existing or not. A topic it may not create either is left to the ACL check
    /// ([`Self::missing_acls`]) or to the process that reads it.
    pub(super) async fn create_unseen(
        &self,
        names: Vec<String>,
        compacted: impl Fn(&str) -> bool,
    ) -> Result<(), BusError> {
        let admin: AdminClient<DefaultClientContext> = self.base.create().map_err(transport)?;
        let lister: rdkafka::consumer::BaseConsumer = self.base.create().map_err(transport)?;
        let seen = tokio::task::spawn_blocking(move || {
            let metadata = lister.fetch_metadata(None, Duration::from_secs(30))?;
            Ok::<_, rdkafka::error::KafkaError>(
                metadata.topics().iter().map(|t| t.name().to_string()).collect::<Vec<_>>(),
            )
        });
        let seen = seen.await.map_err(transport)?.map_err(transport)?;
        let names: Vec<String> = names.into_iter().filter(|name| !seen.contains(name)).collect();
        if names.is_empty() {
            return Ok(());
        }
        let topics: Vec<NewTopic> = names
            .iter()
            .map(|name| {
                let topic = NewTopic::new(
                    name,
                    self.settings.partitions,
                    TopicReplication::Fixed(self.settings.replication_factor),
                );
                if compacted(name) { topic.set("cleanup.policy", "compact") } else { topic }
            })
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for result in admin.create_topics(&topics, &options).await.map_err(transport)? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, RDKafkaErrorCode::TopicAuthorizationFailed)) => {
                    tracing::debug!(topic = %name, "not authorized to create (or describe) the topic: left as it is");
                }
                Err((name, code)) => return Err(BusError::Transport(format!("cannot create topic {name}: {code}"))),
            }
        }
        Ok(())
    }

    /// A consumer in `group`, its offsets stored by hand when a record is done and, with `commit`,
    /// committed in the background.
    fn consumer(
        &self,
        group: &str,
        commit: bool,
        transactions: Option<&Arc<Transactions>>,
        claims: Option<Arc<claims::Claims>>,
    ) -> Result<(StreamConsumer<TrackingContext>, Arc<Mutex<OffsetTracker>>), BusError> {
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        let consumer = consumer(&self.base, &self.settings, group, commit, transactions, claims, tracker.clone())?;
        Ok((consumer, tracker))
    }

    /// The subscription fed by `consumer`'s poller thread.
    fn feed(
        &self,
        consumer: StreamConsumer<TrackingContext>,
        tracker: Arc<Mutex<OffsetTracker>>,
        names: &[String],
        group: &str,
        feeding: Feeding,
        claims: Option<Arc<claims::Claims>>,
        transactions: Option<Arc<Transactions>>,
    ) -> Result<Box<dyn Subscription>, BusError> {
        let consumer = Arc::new(consumer);
        let slot: fenced::Slot = Arc::new(Mutex::new(consumer.clone()));
        let (catch_up, anew) = match feeding {
            Feeding::Follower(catch_up) => (Some(catch_up), None),
            Feeding::Member(make) => {
                (None, Some(fenced::Anew::new(make, tracker.clone(), slot.clone(), transactions.clone())))
            }
        };
        let done_before = transactions.as_ref().map(|_| Arc::new(DoneBefore::default()));
        let rewind = Arc::new(tokio::sync::Notify::new());
        if let (Some(transactions), Some(done_before)) = (&transactions, &done_before) {
            transactions.track(Tracked {
                consumer: Arc::downgrade(&consumer),
                tracker: tracker.clone(),
                done_before: done_before.clone(),
                rewind: rewind.clone(),
            });
        }
        let shared = Shared { catch_up, claims, done_before, rewind, refusals: Refusals::default(), anew };
        let topic_of: HashMap<String, Topic> =
            names.iter().filter_map(|n| Some((n.clone(), self.topic_of(n)?))).collect();
        let (sender, receiver) = mpsc::channel(self.settings.prefetch.max(1));
        let paused = crate::metrics::METRICS.paused_partitions.with_label_values(&[group]);
        let waiting = crate::metrics::METRICS.waiting_records.with_label_values(&[group]);
        // A thread of its own: a revocation blocks the poll that serves it while the revoked
        // partitions' work drains (up to kafka.drain_timeout_ms), and on a shared runtime that would
        // stall every other task there, other stages' pollers included, past max.poll.interval.ms.
        let polled = consumer.clone();
        std::thread::Builder::new()
            .name(format!("poll-{group}"))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                match runtime {
                    Ok(runtime) => runtime.block_on(poll(polled, tracker, topic_of, sender, (paused, waiting), shared)),
                    // Dropping the sender ends the feed: the stage fails and says so.
                    Err(error) => tracing::error!(%error, "cannot start the Kafka poller's runtime"),
                }
            })
            .map_err(transport)?;
        Ok(Box::new(KafkaSubscription { receiver, consumer: slot, transactions }))
    }

    /// Publishes with an explicit attempt number (dead-letter replay counts its attempts).
    pub async fn publish_attempt(&self, record: Record, attempt: u32) -> Result<(), BusError> {
        let name = self.topic_name(record.topic);
        let attempt = attempt.to_string();
        let mut headers = OwnedHeaders::new()
            .insert(Header { key: QUESTION_HEADER, value: Some(record.key.as_bytes()) })
            .insert(Header { key: ATTEMPT_HEADER, value: Some(attempt.as_bytes()) });
        // The publishing span's context, unless the record brings one (a dead letter's replay).
        let trace = if record.trace.is_empty() { crate::telemetry::current_headers() } else { record.trace.clone() };
        if let Some(traceparent) = &trace.traceparent {
            headers = headers.insert(Header { key: TRACEPARENT_HEADER, value: Some(traceparent.as_bytes()) });
        }
        if let Some(tracestate) = &trace.tracestate {
            headers = headers.insert(Header { key: TRACESTATE_HEADER, value: Some(tracestate.as_bytes()) });
        }
        let payload = match self.write_schema_version {
            0 => record.payload,
            version => super::schema::write_as(record.payload, version),
        };
        let mut future = FutureRecord::to(&name).key(record.key.as_bytes()).headers(headers);
        // An empty payload on a table is a tombstone: Kafka's null value, which compaction removes.
        if !(record.topic.is_table() && payload.is_empty()) {
            future = future.payload(payload.as_slice());
        }
        // Progress is for watchers, at once: never held back by, nor lost with, a transaction.
        match self.transactions.get() {
            Some(transactions) if record.topic != Topic::Progress => {
                transactions.send(future, Duration::from_millis(self.settings.message_timeout_ms)).await
            }
            _ => self.send(future).await,
        }
    }

    /// Sends one record, replacing the producer when it hit a fatal error.
    async fn send(&self, future: FutureRecord<'_, [u8], [u8]>) -> Result<(), BusError> {
        let (number, producer) = self.producer.read().unwrap().clone();
        match producer.send(future, Duration::from_millis(self.settings.message_timeout_ms)).await {
            Ok(_) => Ok(()),
            Err((error, _)) if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) => {
                self.renew_producer(number);
                // Worth a retry: it goes out on the new producer.
                Err(transport(error))
            }
            Err((error, _)) => Err(publish_error(error)),
        }
    }
}

#[async_trait]
impl Bus for KafkaBus {
    async fn publish(&self, record: Record) -> Result<(), BusError> {
        self.publish_attempt(record, 1).await
    }

    async fn subscribe(&self, topics: &[Topic], group: &str) -> Result<Box<dyn Subscription>, BusError> {
        let names: Vec<String> = topics.iter().map(|t| self.topic_name(*t)).collect();
        let first = names.first().ok_or_else(|| BusError::Config(format!("{group} subscribes to no topic")))?;
        let transactions = self.transactions(group, first)?;
        let claims =
            claims::Claims::new(self.base.clone(), &format!("{}{group}", self.settings.topic_prefix)).map(Arc::new);
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        // Also how the poller makes it again after a fence by its own rejoin (`fenced.rs`).
        let make: fenced::Make = {
            let (base, settings, group) = (self.base.clone(), self.settings.clone(), group.to_string());
            let (names, transactions, claims, tracker) =
                (names.clone(), transactions.clone(), claims.clone(), tracker.clone());
            Box::new(move || {
                let consumer =
                    consumer(&base, &settings, &group, true, transactions.as_ref(), claims.clone(), tracker.clone())?;
                consumer.subscribe(&names.iter().map(String::as_str).collect::<Vec<_>>()).map_err(transport)?;
                Ok(consumer)
            })
        };
        let consumer = make()?;
        self.feed(consumer, tracker, &names, group, Feeding::Member(make), claims, transactions)
    }

    async fn hold(&self) -> Option<Hold> {
        Some(Hold(Box::new(self.transactions.get()?.pass().await)))
    }

    fn open_transaction(&self) -> Option<Transaction> {
        Some(self.transactions.get()?.open())
    }

    fn keeps_state(&self, stage: &'static str) {
        self.stateful.lock().unwrap().push(stage);
    }

    async fn read_table(&self, topic: Topic) -> Result<Vec<Record>, BusError> {
        let (base, name) = (self.base.clone(), self.topic_name(topic));
        // Never joined nor committed (partitions are assigned by hand), but named under the prefix
        // like every group, for ACLs that grant groups by prefix.
        let group = format!("{}table-reader", self.settings.topic_prefix);
        tokio::task::spawn_blocking(move || read_whole_topic(base, &group, &name, topic)).await.map_err(transport)?
    }
}

/// Who reads a feed: a group member, which is made anew when fenced by its own rejoin, or a follower
/// (partitions assigned by hand, outside any group) with how far it must read to be current.
enum Feeding {
    Member(fenced::Make),
    Follower(Arc<CatchUp>),
}

/// A consumer in `group` on `tracker` (see [`KafkaBus::consumer`]); also how a member fenced by its
/// own rejoin is made anew (`fenced.rs`).
fn consumer(
    base: &ClientConfig,
    settings: &KafkaSettings,
    group: &str,
    commit: bool,
    transactions: Option<&Arc<Transactions>>,
    claims: Option<Arc<claims::Claims>>,
    tracker: Arc<Mutex<OffsetTracker>>,
) -> Result<StreamConsumer<TrackingContext>, BusError> {
    let group_id = format!("{}{group}", settings.topic_prefix);
    let lag = crate::metrics::METRICS.consumer_lag.with_label_values(&[group]);
    let drain_timeout = Duration::from_millis(settings.drain_timeout_ms);
    let context = TrackingContext {
        tracker,
        drain_timeout,
        lag,
        group: group_id.clone(),
        transactions: transactions.map(|t| Arc::downgrade(t) as Weak<dyn rebalance::Transacting>),
        claims,
        lost: Default::default(),
    };
    let mut config = base.clone();
    if let Ok(debug) = std::env::var("LACUNA_KAFKA_DEBUG") {
        config.set("debug", debug);
    }
    if !settings.instance_id.is_empty() {
        // Unique per group: one process may consume several groups.
        config.set("group.instance.id", format!("{}.{group}", settings.instance_id));
    }
    let consumer: StreamConsumer<TrackingContext> = config
        .set("group.id", &group_id)
        // Offsets are stored by hand when a record is done, and committed in the background
        // (exactly-once: in the process's transactions instead).
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", (commit && transactions.is_none()).to_string())
        // What a transaction that is still open or was aborted wrote is never read.
        .set("isolation.level", "read_committed")
        .set("auto.commit.interval.ms", "1000")
        .set("auto.offset.reset", "earliest")
        // A follower (no commits) learns from the broker that it read a partition to its end:
        // read_committed never hands it the marker that ends a transaction (catch_up.rs).
        .set("enable.partition.eof", (!commit).to_string())
        // Incremental rebalances: a member joining or leaving moves only the partitions it must,
        // and only those are drained and committed (config::CONSUMER_PROTOCOL).
        .set("group.protocol", "classic")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", settings.session_timeout_ms.to_string())
        .set("max.poll.interval.ms", settings.max_poll_interval_ms.to_string())
        // librdkafka's statistics carry each assigned partition's lag, exported as a gauge.
        .set("statistics.interval.ms", "5000")
        .create_with_context(context)
        .map_err(transport)?;
    Ok(consumer)
}
