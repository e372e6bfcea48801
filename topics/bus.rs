//! The bus: how stages exchange records without knowing whether they run in one process (bounded
//! in-process queues) or across a cluster (Kafka topics). A stage publishes with an awaited send, so a
//! full downstream slows it down, and acknowledges each delivery once all its outputs were published.

use async_trait::async_trait;

use super::Topic;
use crate::telemetry::TraceHeaders;

/// One event on the wire: JSON bytes keyed by question id.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub topic: Topic,
    pub key: String,
    pub payload: Vec<u8>,
    /// The W3C trace context of the span that published it (Kafka: the `traceparent` and
    /// `tracestate` headers), so that one question is one trace across every process it crosses
    /// (`telemetry/context.rs`). Empty where nothing traces.
    pub trace: TraceHeaders,
}

impl Record {
    pub fn new(topic: Topic, key: impl Into<String>, payload: Vec<u8>) -> Record {
        Record { topic, key: key.into(), payload, trace: TraceHeaders::default() }
    }
}

/// A record handed to a consumer. Acknowledging it tells the bus the record is done with (Kafka: its
/// offset may be committed). A delivery never acknowledged is seen again only after a restart on a
/// durable bus, so it must be refused on purpose ([`Delivery::nack`], which the runner follows by
/// failing its stage) or given up because its partition moved ([`Delivery::claim`]); dropping one
/// otherwise is a bug, and is logged and counted as one.
pub struct Delivery {
    pub record: Record,
    /// 1 on first delivery; higher when a dead letter is replayed (the `lacuna-attempt` header).
    pub attempt: u32,
    /// How many times earlier processes started this very record and never finished it (they
    /// crashed): known once claimed, on Kafka; 0 elsewhere.
    pub redeliveries: u32,
    /// Kafka: the record's partition and offset, for a reader that stores its position with what
    /// it writes (the answers sink). None elsewhere.
    pub position: Option<(i32, i64)>,
    /// Exactly-once: why the broker refused an output of this very record before, in a transaction
    /// that was then aborted. Redoing it would be refused again: its question ends in an error record.
    pub rejected: Option<String>,
    claim: Option<Box<dyn FnOnce() -> Option<u32> + Send>>,
    start: Option<Box<dyn FnOnce(u32) + Send>>,
    owned: Option<Box<dyn Fn() -> bool + Send + Sync>>,
    ack: Option<Box<dyn FnOnce() + Send>>,
    refused: Option<Box<dyn FnOnce(String) + Send>>,
}

/// What a durable bus does when a delivery is taken on, started, acknowledged or refused.
pub struct DeliveryHooks {
    /// Marks the record as this process's to work on, and returns how many times earlier processes
    /// started it; None when its partition was revoked meanwhile.
    pub claim: Box<dyn FnOnce() -> Option<u32> + Send>,
    /// Counts the start where a crash during the work would be seen (before the work begins): the
    /// record's starts in all, this one included.
    pub start: Box<dyn FnOnce(u32) + Send>,
    /// Whether the record is still this process's to finish: false once its partition was revoked
    /// (the new owner reads it again from the last committed position).
    pub owned: Box<dyn Fn() -> bool + Send + Sync>,
    pub ack: Box<dyn FnOnce() + Send>,
    /// Keeps why the broker refused an output of the record, for when it is delivered again.
    pub refused: Box<dyn FnOnce(String) + Send>,
}

impl Delivery {
    pub fn new(record: Record, attempt: u32, hooks: Option<DeliveryHooks>) -> Self {
        let (claim, start, owned, ack, refused) = match hooks {
            Some(h) => (Some(h.claim), Some(h.start), Some(h.owned), Some(h.ack), Some(h.refused)),
            None => (None, None, None, None, None),
        };
        Delivery { record, attempt, redeliveries: 0, position: None, rejected: None, claim, start, owned, ack, refused }
    }

    /// The delivery, whose outputs the broker refused before (see [`Delivery::rejected`]).
    pub fn refused_before(mut self, reason: Option<String>) -> Self {
        self.rejected = reason;
        self
    }

    /// The delivery, read at `offset` of `partition`.
    pub fn at(mut self, partition: i32, offset: i64) -> Self {
        self.position = Some((partition, offset));
        self
    }

    /// Takes the delivery on, learning its [`Delivery::redeliveries`]. `None` when the bus no longer
    /// wants it processed here (Kafka: its partition was revoked while it waited; its new owner
    /// reads it again).
    pub fn claim(mut self) -> Option<Self> {
        if let Some(claim) = self.claim.take() {
            match claim() {
                Some(earlier) => self.redeliveries = earlier,
                None => {
                    // Given up, not dropped: nothing to acknowledge here any more.
                    self.let_go();
                    return None;
                }
            }
        }
        Some(self)
    }

    /// [`Delivery::claim`] on a thread of the blocking pool: on Kafka it is a broker round trip (up
    /// to 10 s against a slow group coordinator), which on the stage's own thread would freeze every
    /// event of the stage meanwhile, those holding an open transaction included.
    pub async fn claim_off_thread(self) -> Option<Self> {
        if self.claim.is_none() {
            return Some(self);
        }
        tokio::task::spawn_blocking(move || self.claim()).await.expect("a claim does not panic")
    }

    /// The work on a claimed delivery begins now: a crash from here on counts against it. Called
    /// when nothing else that could be blamed for that crash is being started beside a suspect.
    pub fn start(&mut self) {
        if let Some(start) = self.start.take() {
            start(self.redeliveries + 1);
        }
    }

    /// [`Delivery::start`] on a thread of the blocking pool, for the reason
    /// [`Delivery::claim_off_thread`] gives; returns once the start is counted.
    pub async fn start_off_thread(&mut self) {
        if let Some(start) = self.start.take() {
            let starts = self.redeliveries + 1;
            tokio::task::spawn_blocking(move || start(starts)).await.expect("a start does not panic");
        }
    }

    /// Whether this process may still publish the record's outcome. False on Kafka once the
    /// record's partition was revoked: its new owner does it again from the last committed position,
    /// so outputs published here too would reach the next topic twice.
    pub fn owned(&self) -> bool {
        self.owned.as_ref().is_none_or(|owned| owned())
    }

    /// Lets go of a delivery that is no longer this process's ([`Delivery::owned`] false): nothing to
    /// acknowledge or refuse.
    pub fn let_go(mut self) {
        self.ack = None;
    }

    /// Lets go of a delivery whose transaction was aborted ([`BusError::Aborted`]): the bus delivers
    /// it again from the last commit. `rejected` keeps why the broker refused one of its outputs,
    /// so that the redelivery ends its question instead of being refused again.
    pub fn let_go_aborted(mut self, rejected: Option<String>) {
        if let (Some(reason), Some(refused)) = (rejected, self.refused.take()) {
            refused(reason);
        }
        self.let_go();
    }

    /// The record, acknowledged: for readers that are done with it once they have it.
    pub fn into_record(self) -> Record {
        let record = self.record.clone();
        self.ack();
        record
    }

    pub fn ack(mut self) {
        if let Some(ack) = self.ack.take() {
            ack();
        }
    }

    /// Refuses the delivery on purpose: it stays unacknowledged, so its position is not committed and
    /// a restarted consumer reads it again. Whoever nacks must make that restart happen.
    pub fn nack(mut self, reason: &str) {
        if self.ack.take().is_some() {
            crate::metrics::METRICS.nacks.with_label_values(&[self.record.topic.name()]).inc();
            tracing::error!(topic = self.record.topic.name(), key = %self.record.key, reason, "delivery refused (nack)");
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if self.ack.is_some() {
            crate::metrics::METRICS.dropped_deliveries.with_label_values(&[self.record.topic.name()]).inc();
            tracing::error!(
                topic = self.record.topic.name(),
                key = %self.record.key,
                "delivery dropped without ack or nack: its position stays uncommitted until a restart"
            );
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("topic {0:?} already has a consumer in this process")]
    AlreadySubscribed(Topic),
    #[error("the bus is closed")]
    Closed,
    #[error("bus transport error: {0}")]
    Transport(String),
    /// The bus's configuration cannot work (a secret in plain properties, a missing variable).
    #[error("kafka configuration: {0}")]
    Config(String),
    /// The bus will never take this record (too large, unknown topic, not authorised): retrying
    /// cannot help.
    #[error("the bus rejected the record: {0}")]
    Rejected(String),
    /// Exactly-once: the transaction this publish went into cannot commit (a record in it failed).
    /// The bus aborts it and rewinds to the last commit, so the event that published is delivered
    /// again; nothing of it is kept. `rejected` says why when the broker will never take this very
    /// record.
    #[error("the transaction was aborted: {reason}")]
    Aborted { reason: String, rejected: Option<String> },
}

/// One transaction of an exactly-once bus, as its outputs' publishers hold it: aborted once the bus
/// gave it up (what it held is undone and redone from the last commit), committed otherwise.
#[derive(Clone, Debug, Default)]
pub struct Transaction(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Transaction {
    pub fn aborted(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The bus aborted it: work finished in it is no longer done.
    pub fn abort(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Held while a stage publishes what one event or tick produced and acknowledges the event: a bus
/// with transactions commits none meanwhile, so no transaction holds part of one event's outputs.
pub struct Hold(pub Box<dyn Send>);

tokio::task_local! {
    /// Set while a task runs [`atomically`], to when its hold began: its publishes need no hold of
    /// their own, and a bus with transactions bounds the whole hold, not each publish alone.
    static HOLDING: tokio::time::Instant;
}

/// Whether the running task holds a [`Hold`].
pub fn holding_now() -> bool {
    held_since().is_some()
}

/// When the running task's [`Hold`] began, if it holds one.
pub fn held_since() -> Option<tokio::time::Instant> {
    HOLDING.try_with(|since| *since).ok()
}

/// Runs `work` (publishes, then the acknowledgement) so that its effects commit together. Inside
/// another `atomically` it runs as it is: the outer hold covers it (a second would wait on a commit
/// that waits on the first).
pub async fn atomically<F: std::future::Future>(bus: &dyn Bus, work: F) -> F::Output {
    if holding_now() {
        return work.await;
    }
    match bus.hold().await {
        Some(hold) => {
            let output = as_held(work).await;
            drop(hold);
            output
        }
        None => work.await,
    }
}

/// Runs `work` as a task holding a [`Hold`] from now: what [`atomically`] does once it has one.
pub(crate) async fn as_held<F: std::future::Future>(work: F) -> F::Output {
    HOLDING.scope(tokio::time::Instant::now(), work).await
}

#[async_trait]
pub trait Bus: Send + Sync + 'static {
    /// Returns once the record is accepted: queued in process, or acknowledged by the broker.
    async fn publish(&self, record: Record) -> Result<(), BusError>;

    /// Records of `topics` for consumer group `group`. When several topics are given, earlier ones
    /// are served first: stages list their loop input before new work, so questions already in
    /// flight finish before new ones start.
    async fn subscribe(&self, topics: &[Topic], group: &str) -> Result<Box<dyn Subscription>, BusError>;

    /// Exactly-once buses: keeps transactions from committing while it lives (see [`atomically`]).
    async fn hold(&self) -> Option<Hold> {
        None
    }

    /// The transaction that publishes join now (Kafka with `bus.delivery = "exactly_once"`), asked
    /// while holding a [`Hold`], so none commits or aborts meanwhile. A record comes again when the
    /// transaction of its outputs was aborted: what remembers it as finished asks this one.
    fn open_transaction(&self) -> Option<Transaction> {
        None
    }

    /// `stage`, in this process, keeps state in memory beside what it publishes (the join): a bus
    /// that rewinds after an aborted transaction cannot rewind that state, and ends the process
    /// instead, whose restart rebuilds it.
    fn keeps_state(&self, _stage: &'static str) {}

    /// The current records of a table topic ([`Topic::is_table`]), oldest first, deletions applied:
    /// what a stage reads back on start to rebuild its state.
    async fn read_table(&self, topic: Topic) -> Result<Vec<Record>, BusError>;
}

#[async_trait]
pub trait Subscription: Send {
    /// The next record; `None` once the bus is closed.
    async fn next(&mut self) -> Option<Delivery>;

    /// Makes the acknowledged position durable now (Kafka: a synchronous offset commit). Called on
    /// shutdown after in-flight work is done; a bus with nothing durable has nothing to do.
    async fn commit(&mut self) -> Result<(), BusError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A bus whose holds are counted, and nothing else.
    #[derive(Default)]
    struct Holding(AtomicUsize);

    #[async_trait]
    impl Bus for Holding {
        async fn publish(&self, _: Record) -> Result<(), BusError> {
            Ok(())
        }
        async fn subscribe(&self, _: &[Topic], _: &str) -> Result<Box<dyn Subscription>, BusError> {
            Err(BusError::Closed)
        }
        async fn hold(&self) -> Option<Hold> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Some(Hold(Box::new(())))
        }
        async fn read_table(&self, _: Topic) -> Result<Vec<Record>, BusError> {
            Ok(Vec::new())
        }
    }

    /// The join's event is atomic whole and its outputs again inside: one hold, not two (a second
    /// would wait on a commit that waits on the first).
    #[tokio::test]
    async fn atomically_inside_atomically_takes_no_second_hold() {
        let bus = Holding::default();
        let inner = atomically(&bus, async { atomically(&bus, async { holding_now() }).await }).await;
        assert!(inner, "the inner work runs holding");
        assert_eq!(bus.0.load(Ordering::SeqCst), 1);
        assert!(!holding_now());
    }
}
