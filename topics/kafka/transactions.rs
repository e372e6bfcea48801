//! Exactly-once processing (`bus.delivery = "exactly_once"`): what a stage process publishes and the
//! positions of what it consumed are committed together, in one Kafka transaction, or not at all.
//!
//! - One transactional producer per process, made when the process first joins a consumer group,
//!   under a `transactional.id` of its own. Where `kafka.instance_id` is set, a restarted replica
//!   first aborts the transaction its crashed predecessor left open (`lineage`); otherwise the
//!   broker aborts it after `kafka.transaction_timeout_ms`. Offsets are sent with each consumer's
//!   group metadata, so a zombie of an older group generation is fenced (KIP-447).
//! - A transaction is committed every `kafka.transaction_interval_ms` (Kafka Streams: 100 ms), and
//!   before partitions are revoked and on shutdown. Stages work on many records at once and finish
//!   them out of order, so a commit carries, per partition, the position before the first record not
//!   done, and in its metadata the offsets done beyond it: a process that resumes there skips those
//!   (their outputs are in the same committed transaction).
//! - A commit waits until no record is between its first output and its acknowledgement
//!   ([`Gate`]): a transaction never holds part of a record's outputs.
//! - Progress records go through the plain producer: watchers see steps at once, and a step of
//!   aborted work is harmless (readers keep one per node and index).
//! - A transaction that cannot commit (a record in it failed, the commit itself failed, or the group
//!   gave a consumer's partitions away) is aborted, and the process goes on from the last commit,
//!   as Kafka Streams does: every poller seeks back to the committed positions, what was fetched or
//!   finished since is no longer this process's, and the claims let go of what was started. A
//!   fenced or fatally failed producer is replaced by one under a new transactional id. Only a
//!   process with a stage that keeps state in memory (the join) exits instead, to rebuild it.

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::carried::{Positions, Tracked};
use super::gate::{Gate, Pass, held, hold_budget};
use super::offsets::OffsetTracker;
use super::rebalance::{TrackingContext, Transacting};
use super::settle::{SETTLE_ASKS, init_transactions};
use super::wire::{publish_error, transport};
use crate::topics::bus::{BusError, Transaction, held_since};

type Alive = Arc<StreamConsumer<TrackingContext>>;

/// The consumer a revocation is for, whose close may have begun: reached only from here then.
type Closing<'a> = Option<&'a BaseConsumer<TrackingContext>>;

/// Makes a transactional producer under a new transactional id, its transactions initialised: what
/// replaces one that is fenced, hit a fatal error, or could not abort. It first settles the
/// transaction of the id it is given, the one left behind (see [`Transactions::begin_again`]).
pub(super) type Renew = Box<dyn Fn(&str) -> Result<(String, FutureProducer), BusError> + Send + Sync>;

pub struct Transactions {
    producer: RwLock<FutureProducer>,
    /// The producer's transactional id.
    id: Mutex<String>,
    renew: Renew,
    gate: Arc<Gate>,
    /// The consumers whose positions each commit carries.
    consumers: Mutex<Vec<Tracked>>,
    /// One commit at a time: the timer's, a revocation's, a shutdown's.
    committing: Mutex<Positions>,
    /// Something was published since the last commit.
    dirty: std::sync::atomic::AtomicBool,
    /// Why the open transaction cannot commit (a record in it failed), once something failed.
    broken: Mutex<Option<String>>,
    /// The open transaction, as the work finished in it remembers it: marked aborted at an abort.
    open: Mutex<Transaction>,
    /// Stages of this process that keep state in memory, which an abort would leave ahead of what
    /// the bus holds: with one, the process cannot go on after an abort and exits instead.
    stateful: Stateful,
    timeout: Duration,
}

/// The least time a commit is asked with, of its half of `kafka.transaction_timeout_ms`: a quarter
/// (1.25 s of the default 10 s), room for the coordinator's round trips.
fn commit_share(transaction_timeout: Duration) -> Duration {
    hold_budget(transaction_timeout) / 4
}

/// The stages of a process that keep state in memory ([`crate::topics::Bus::keeps_state`]).
pub(super) type Stateful = Arc<Mutex<Vec<&'static str>>>;

impl Transactions {
    /// Makes the producer, begins its first transaction, and starts committing every `interval`.
    pub(super) fn start(
        (id, producer): (String, FutureProducer),
        (renew, stateful): (Renew, Stateful),
        interval: Duration,
        timeout: Duration,
    ) -> Result<Arc<Transactions>, BusError> {
        init_transactions(&producer, timeout)?;
        producer.begin_transaction().map_err(transport)?;
        let transactions = Arc::new(Transactions {
            producer: RwLock::new(producer),
            id: Mutex::new(id),
            renew,
            gate: Arc::default(),
            consumers: Mutex::default(),
            committing: Mutex::default(),
            dirty: Default::default(),
            broken: Mutex::default(),
            open: Mutex::default(),
            stateful,
            timeout,
        });
        // A commit stuck inside librdkafka past every timeout blocks every event of the process
        // for good, and no abort can run beside it: the process exits, and its restart settles the
        // transaction (see `lineage`). The limit leaves room for a recovery's own bounded calls:
        // the commit's and the abort's halves of `timeout`, the settling's asks, the new id's note
        // and the new producer's initialisation.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let limit = (2 + SETTLE_ASKS) * timeout + super::wire::NOTE_TIMEOUT;
            runtime.spawn(super::gate::watch(Arc::downgrade(&transactions.gate), limit, move |closed| {
                tracing::error!(
                    closed_s = closed.as_secs(),
                    "a Kafka transaction call has kept the commit closed past every timeout it was given \
                     (librdkafka#5456): exiting so that a restart settles the transaction"
                );
                crate::telemetry::exit::exit(75);
            }));
        }
        let weak = Arc::downgrade(&transactions);
        std::thread::Builder::new()
            .name("kafka-commit".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(interval);
                    let Some(transactions) = weak.upgrade() else { return };
                    transactions.commit();
                }
            })
            .map_err(transport)?;
        Ok(transactions)
    }

    pub(super) fn track(&self, tracked: Tracked) {
        let mut consumers = self.consumers.lock().unwrap();
        // Those closed since are gone for good (their revocation committed them): not kept forever.
        consumers.retain(|tracked| tracked.consumer.strong_count() > 0);
        consumers.push(tracked);
    }

    /// The consumer behind `tracker` was made anew (`fenced.rs`): commits carry the new one's
    /// group metadata; the fenced one's would be refused.
    pub(super) fn retrack(&self, tracker: &Arc<Mutex<OffsetTracker>>, consumer: Weak<StreamConsumer<TrackingContext>>) {
        for tracked in self.consumers.lock().unwrap().iter_mut() {
            if Arc::ptr_eq(&tracked.tracker, tracker) {
                tracked.consumer = consumer.clone();
            }
        }
    }

    pub(super) async fn pass(&self) -> Pass {
        self.gate.enter().await
    }

    /// The transaction publishes join now: stable while a pass is held.
    pub(super) fn open(&self) -> Transaction {
        self.open.lock().unwrap().clone()
    }

    /// Publishes within the open transaction (with a pass of its own unless the task holds one). A
    /// record that fails leaves the transaction unable to commit: the whole transaction is aborted
    /// at the next commit, every poller seeks back to the last committed positions, and the event is
    /// redone. The error says so ([`BusError::Aborted`]), with the reason when the broker will never
    /// take this record, so that its redo ends its question in an error record instead.
    ///
    /// The task's whole hold, not each publish alone, gets half of `kafka.transaction_timeout_ms`
    /// ([`hold_budget`]): an event that publishes many records (the join's state, then what goes
    /// on) could otherwise keep the transaction open past the timeout one bounded publish at a
    /// time. A publish past that half gives the transaction up.
    pub(super) async fn send(&self, record: FutureRecord<'_, [u8], [u8]>, wait: Duration) -> Result<(), BusError> {
        let since = held_since();
        let _pass = if since.is_some() { None } else { Some(self.gate.enter().await) };
        let held_for = since.map_or(Duration::ZERO, |since| since.elapsed());
        let left = hold_budget(self.timeout).saturating_sub(held_for);
        if left.is_zero() {
            let reason = format!(
                "an event held the open transaction for {held_for:?} of its publishes, past half of kafka.transaction_timeout_ms ({:?})",
                self.timeout
            );
            self.broken.lock().unwrap().get_or_insert_with(|| reason.clone());
        }
        if let Some(reason) = self.broken.lock().unwrap().clone() {
            return Err(BusError::Aborted { reason, rejected: None });
        }
        self.dirty.store(true, std::sync::atomic::Ordering::Relaxed);
        let producer = self.producer.read().unwrap().clone();
        match producer.send(record, wait.min(left)).await {
            Ok(_) => Ok(()),
            Err((error, _)) => {
                let reason = error.to_string();
                let rejected = matches!(publish_error(error), BusError::Rejected(_)).then(|| reason.clone());
                self.broken.lock().unwrap().get_or_insert_with(|| reason.clone());
                Err(BusError::Aborted { reason, rejected })
            }
        }
    }

    /// Commits what was published and consumed since the last commit, then begins the next
    /// transaction. Blocking: called from the commit thread, a revocation, or a shutdown.
    pub(super) fn commit(&self) {
        self.commit_for(None, &|| {});
    }

    /// [`Transactions::commit`], then `then` before any publish can join the next transaction (a
    /// revocation forgets its partitions there). A transaction that cannot commit is aborted and
    /// every consumer rewound instead. `closing` is the consumer a revocation is for.
    ///
    /// The consumers the commit read are let go only after the commit lock: where one of them was
    /// the last reference (its stage stopped meanwhile), dropping it closes the consumer, and its
    /// close revokes its partitions, which commits (here) again. Dropped under the lock, it waited
    /// on itself, and every commit of the process with it (tests/prometheus.rs hung on stopping).
    fn commit_for(&self, closing: Closing, then: &dyn Fn()) {
        let mut alive = Vec::new();
        let mut last = self.committing.lock().unwrap();
        self.gate.close();
        let broken = self.broken.lock().unwrap().clone();
        let outcome = match broken {
            Some(reason) => Err(("publish_failed", reason)),
            None => self.commit_closed(&mut last, &mut alive, closing).map_err(|reason| ("commit_failed", reason)),
        };
        if let Err((cause, reason)) = outcome {
            self.recover(cause, &reason);
        }
        then();
        self.gate.open();
        drop(last);
        drop(alive);
    }

    fn commit_closed(&self, last: &mut Positions, alive: &mut Vec<Alive>, closing: Closing) -> Result<(), String> {
        let started = std::time::Instant::now();
        let outcome = self.commit_within(last, alive, closing, started + hold_budget(self.timeout));
        held("commit", started.elapsed());
        outcome
    }

    /// [`Self::commit_closed`], its broker calls all done by `deadline`. The consumers it reads stay
    /// in `alive`: see [`Transacting::commit_then`].
    fn commit_within(
        &self,
        last: &mut Positions,
        alive: &mut Vec<Alive>,
        closing: Closing,
        deadline: std::time::Instant,
    ) -> Result<(), String> {
        let said = |error: KafkaError| error.to_string();
        let left = || deadline.saturating_duration_since(std::time::Instant::now()).max(Duration::from_millis(1));
        let producer = self.producer.read().unwrap().clone();
        let mut sent = Vec::new();
        for tracked in self.consumers.lock().unwrap().iter() {
            let (group, metadata) = match tracked.consumer.upgrade() {
                Some(consumer) => {
                    let member = (consumer.context().group.clone(), consumer.group_metadata());
                    alive.push(consumer);
                    member
                }
                // A consumer that closes has no `Arc` left by its revocation, which commits here and
                // hands it over: its positions go with the outputs of the records it finished.
                None => match closing.filter(|closing| Arc::ptr_eq(&closing.context().tracker, &tracked.tracker)) {
                    Some(closing) => (closing.context().group.clone(), closing.group_metadata()),
                    None => continue, // closed before, and committed at its close
                },
            };
            let Some(metadata) = metadata else { continue };
            if let Some(carried) = tracked.carried(&group, last)? {
                producer.send_offsets_to_transaction(&carried.offsets, &metadata, left()).map_err(said)?;
                sent.extend(carried.sent);
            }
        }
        // Taken whatever `sent` holds: a commit with offsets carries the publishes too, and the next
        // tick must not commit them again as an empty transaction.
        let published = self.dirty.swap(false, std::sync::atomic::Ordering::Relaxed);
        if sent.is_empty() && !published {
            return Ok(()); // nothing to commit: the open transaction goes on
        }
        // A commit asked with too little time left times out here and may still be finished by
        // the broker: the abort after it is refused, and the producer must be replaced and its id
        // settled. With less than a commit's share left (the offsets took the rest), the
        // transaction is given up before its commit is asked, and aborts cleanly.
        let left_now = deadline.saturating_duration_since(std::time::Instant::now());
        if left_now < commit_share(self.timeout) {
            return Err(format!(
                "the transaction's offsets left {left_now:?} of the commit's half of kafka.transaction_timeout_ms, \
                 under the {:?} a commit is given: not asked",
                commit_share(self.timeout)
            ));
        }
        // What a restart resumes from if this commit lands, to set beside what it reads back.
        tracing::debug!(transactional_id = %self.id.lock().unwrap(), positions = ?sent, "committing");
        // A commit that timed out may be asked again (librdkafka resumes it) while time is left.
        loop {
            match producer.commit_transaction(left()) {
                Ok(()) => break,
                Err(KafkaError::Transaction(error)) if error.is_retriable() && std::time::Instant::now() < deadline => {
                }
                Err(error) => return Err(said(error)),
            }
        }
        crate::metrics::METRICS.transactions.with_label_values::<&str>(&[]).inc();
        tracing::debug!(transactional_id = %self.id.lock().unwrap(), "committed");
        last.extend(sent);
        *self.open.lock().unwrap() = Transaction::default();
        producer.begin_transaction().map_err(said)
    }

    /// The open transaction cannot commit: it is aborted (or, when the producer was fenced or hit a
    /// fatal error, left to the broker and a new producer made under a new transactional id), a new
    /// one begun, and every consumer rewound: what was published or acknowledged since the last
    /// commit is redone from the committed positions. Called with the gate closed, so no event is
    /// between its first output and its acknowledgement. A process with a stage that keeps state in
    /// memory cannot rebuild it here, and exits to resume from the last commit.
    fn recover(&self, cause: &'static str, reason: &str) {
        crate::metrics::METRICS.transaction_aborts.with_label_values(&[cause]).inc();
        // What finished in it is undone: remembered as finished, its redo would be skipped.
        std::mem::take(&mut *self.open.lock().unwrap()).abort();
        if let Some(stage) = self.stateful.lock().unwrap().first() {
            tracing::error!(
                cause,
                reason,
                stage,
                "Kafka transaction aborted, and the stage's state in memory cannot be rewound with it: exiting to resume from the last commit"
            );
            self.abort_or_leave();
            crate::telemetry::exit::exit(75);
        }
        tracing::warn!(cause, reason, "Kafka transaction aborted: rewinding every consumer to the last commit");
        if let Err(error) = self.begin_again() {
            tracing::error!(%error, "no transaction can begin after the abort: exiting to resume from the last commit");
            crate::telemetry::exit::exit(75);
        }
        *self.broken.lock().unwrap() = None;
        self.dirty.store(false, std::sync::atomic::Ordering::Relaxed);
        for tracked in self.consumers.lock().unwrap().iter() {
            tracked.tracker.lock().unwrap().rewind();
            tracked.rewind.notify_one();
        }
    }

    /// Aborts the open transaction where the producer still can; true when it did.
    fn abort_or_leave(&self) -> bool {
        let producer = self.producer.read().unwrap().clone();
        if producer.client().fatal_error().is_some() {
            return false;
        }
        match producer.abort_transaction(hold_budget(self.timeout)) {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, "cannot abort the transaction: a new producer takes over");
                false
            }
        }
    }

    /// Aborts and begins the next transaction, or replaces a producer that cannot: fenced, fatal, or
    /// refused the abort.
    ///
    /// A producer left so may still have a commit under way: a commit that timed out here is not
    /// one that failed, and the broker finishes a commit it has taken (a refused abort says
    /// "Conflicting commit_transaction API call is already in progress"). Were the work redone
    /// from the positions read now, that commit could land after it and commit the work twice (the
    /// failure matrix saw one question answered twice so, its transaction coordinator's node
    /// killed). So the left id is settled first: re-initialised, which the broker answers only once
    /// a commit under way has finished, and which aborts a transaction still open and fences its
    /// producer; then the positions the rewind reads are final. Settling that no coordinator
    /// answers in [`SETTLE_ASKS`] asks of `kafka.transaction_timeout_ms` ends the process
    /// (its restart settles the replica's lineage).
    fn begin_again(&self) -> Result<(), BusError> {
        if self.abort_or_leave() && self.producer.read().unwrap().begin_transaction().is_ok() {
            return Ok(());
        }
        let left = self.id.lock().unwrap().clone();
        let (id, fresh) = (self.renew)(&left)?;
        fresh.begin_transaction().map_err(transport)?;
        crate::metrics::METRICS.producer_renewals.with_label_values::<&str>(&[]).inc();
        *self.producer.write().unwrap() = fresh;
        *self.id.lock().unwrap() = id;
        Ok(())
    }
}

impl Transacting for Transactions {
    fn commit_then(&self, revoking: &BaseConsumer<TrackingContext>, then: &dyn Fn()) {
        self.commit_for(Some(revoking), then);
    }

    /// The group gave this consumer's partitions to another member while it was away (a pause past
    /// `session.timeout.ms`): nothing done on them may be published or committed here, so the open
    /// transaction is aborted and every consumer rewound, then `then` forgets the lost partitions.
    fn abort_then(&self, reason: &str, then: &dyn Fn()) {
        let _last = self.committing.lock().unwrap();
        self.gate.close();
        self.recover("assignment_lost", reason);
        then();
        self.gate.open();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broker that cannot do transactions (here librdkafka's mock cluster with InitProducerId
    /// turned off) stops an exactly-once process at start with a message that names the setting
    /// that runs it without them (issue 74).
    #[test]
    fn a_broker_without_transactions_is_told_at_start_to_use_at_least_once() {
        use rdkafka::mocking::MockCluster;
        use rdkafka::types::RDKafkaApiKey;
        let cluster = MockCluster::new(1).unwrap();
        cluster.apiversion(RDKafkaApiKey::InitProducerId, None, None).unwrap();
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("transactional.id", "no-transactions")
            .create()
            .unwrap();
        let renew: Renew = Box::new(|_| Err(BusError::Transport("not renewed".into())));
        let started = Transactions::start(
            ("no-transactions".into(), producer),
            (renew, Stateful::default()),
            Duration::from_millis(100),
            Duration::from_secs(5),
        );
        let Err(error) = started else { panic!("transactions started on a broker without them") };
        let said = error.to_string();
        assert!(said.contains("bus.delivery = \"at_least_once\""), "{said}");
    }

    /// Transactions under `id` on librdkafka's mock cluster (one broker, topic "t"), committed only
    /// when a test asks, never replacing their producer.
    fn on_a_mock_cluster(
        id: &str,
        timeout: Duration,
    ) -> (rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>, Arc<Transactions>) {
        let cluster = rdkafka::mocking::MockCluster::new(1).unwrap();
        cluster.create_topic("t", 1, 1).unwrap();
        let producer: FutureProducer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("transactional.id", id)
            .create()
            .unwrap();
        let renew: Renew = Box::new(|_| Err(BusError::Transport("not renewed".into())));
        let transactions = Transactions::start(
            (id.into(), producer),
            (renew, Stateful::default()),
            Duration::from_secs(3600),
            timeout,
        )
        .unwrap();
        (cluster, transactions)
    }

    /// Finding 4 of issue 74: the join publishes inside its whole event's hold (its state, then
    /// what goes on), each publish bounded on its own; together they could keep the open
    /// transaction from committing past `kafka.transaction_timeout_ms`, and the broker would abort
    /// it under the commit. A publish past half of it, counted from the hold's start, is refused,
    /// and the transaction given up (aborted at the next commit, the event redone).
    #[tokio::test(start_paused = true)]
    async fn a_publish_past_half_the_transaction_timeout_into_a_hold_gives_the_transaction_up() {
        let timeout = Duration::from_secs(10);
        let (_cluster, transactions) = on_a_mock_cluster("a-long-hold", timeout);
        let sent = crate::topics::bus::as_held(async {
            tokio::time::advance(hold_budget(timeout) + Duration::from_millis(1)).await;
            transactions.send(FutureRecord::to("t").key(&b"k"[..]).payload(&b"late"[..]), timeout).await
        })
        .await;
        let Err(BusError::Aborted { reason, rejected: None }) = sent else { panic!("sent: {sent:?}") };
        assert!(reason.contains("kafka.transaction_timeout_ms"), "{reason}");
        assert!(transactions.broken.lock().unwrap().is_some(), "the transaction goes on as if the hold were short");
    }

    /// Issue 74, from the failure matrix: `send_offsets_to_transaction` can spend nearly all of a
    /// commit's half of `kafka.transaction_timeout_ms`, and the commit was then asked with what was
    /// left (once 4 ms). A commit asked and timed out may still be finished by the broker, so the
    /// abort that follows is refused and the producer must be replaced and its id settled. A commit
    /// with too little time left is not asked: the transaction aborts cleanly, on its own producer.
    #[tokio::test]
    async fn a_commit_with_its_time_spent_is_not_asked_and_the_transaction_aborts_cleanly() {
        let timeout = Duration::from_secs(10);
        let (cluster, transactions) = on_a_mock_cluster("a-late-commit", timeout);
        transactions.send(FutureRecord::to("t").key(&b"k"[..]).payload(&b"work"[..]), timeout).await.unwrap();
        // Every reply from the coordinator now takes longer than the few milliseconds left.
        cluster.broker_round_trip_time(1, Duration::from_millis(300)).unwrap();
        let (mut last, mut alive) = (Positions::default(), Vec::new());
        let nearly_spent = std::time::Instant::now() + Duration::from_millis(4);
        let committed = transactions.commit_within(&mut last, &mut alive, None, nearly_spent);
        assert!(committed.is_err(), "a commit with 4 ms left reported committed");
        assert!(transactions.abort_or_leave(), "the abort was refused: a commit was left under way");
    }

    /// A consumer that closes (its stage stopped, or the process shut down) revokes its partitions,
    /// which commits. But its last `Arc` is gone by then, so the commit could not reach it through
    /// the `Weak` it keeps: the positions of the records it finished since the last commit were
    /// left out, while those records' outputs went in. Their next owner redid them from the older
    /// position and committed their outputs a second time. On librdkafka's mock cluster: one
    /// record read and finished, its answer published, then the consumer dropped.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_consumer_that_closes_commits_the_positions_of_the_records_it_finished() {
        use rdkafka::Message;
        use rdkafka::config::ClientConfig;
        use rdkafka::consumer::{Consumer, StreamConsumer};

        use super::super::offsets::OffsetTracker;
        use super::super::rebalance::{TrackingContext, context_for_tests};

        let timeout = Duration::from_secs(10);
        let (cluster, transactions) = on_a_mock_cluster("a-closing-consumer", timeout);
        cluster.create_topic("in", 1, 1).unwrap();
        let base = ClientConfig::new().set("bootstrap.servers", cluster.bootstrap_servers()).clone();
        let question = FutureRecord::to("in").key(&b"q"[..]).payload(&b"question"[..]);
        base.create::<FutureProducer>().unwrap().send(question, timeout).await.unwrap();
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        let mut context = context_for_tests(tracker.clone());
        context.transactions = Some(Arc::downgrade(&transactions) as Weak<dyn Transacting>);
        let consumer: Arc<StreamConsumer<TrackingContext>> = Arc::new(
            base.clone()
                .set("group.id", "g")
                .set("auto.offset.reset", "earliest")
                .create_with_context(context)
                .unwrap(),
        );
        consumer.subscribe(&["in"]).unwrap();
        let read = tokio::time::timeout(Duration::from_secs(30), consumer.recv()).await.unwrap().unwrap();
        let offset = read.offset();
        drop(read);
        transactions.track(Tracked {
            consumer: Arc::downgrade(&consumer),
            tracker: tracker.clone(),
            done_before: Arc::default(),
            rewind: Arc::default(),
        });
        {
            let mut tracker = tracker.lock().unwrap();
            let assignment = tracker.register("in", 0, offset);
            assert!(tracker.claim("in", 0, offset, assignment));
            tracker.ack("in", 0, offset, assignment);
        }
        let answer = FutureRecord::to("t").key(&b"q"[..]).payload(&b"answer"[..]);
        transactions.send(answer, timeout).await.unwrap();
        tokio::task::spawn_blocking(move || drop(consumer)).await.unwrap();
        let answered = !transactions.dirty.load(std::sync::atomic::Ordering::Relaxed);
        assert!(answered, "the consumer's close committed nothing: the answer is still in the open transaction");
        let carried = transactions.committing.lock().unwrap().get(&("g".into(), "in".into(), 0)).cloned();
        assert_eq!(
            carried.map(|(position, _)| position),
            Some(offset + 1),
            "the answer was committed without the position of the question it answers: its next owner answers it again"
        );
    }
}
