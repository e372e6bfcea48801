//! The consumer's poller and the subscription a stage reads from: records go to a bounded channel,
//! a full channel pauses the partitions while polling goes on, and each delivery carries the hooks
//! that claim and acknowledge its offset.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::catch_up::CatchUp;
use super::claims::Claims;
use super::done_ledger::DoneBefore;
use super::fenced::{self, Anew, Slot};
use super::offsets::{OffsetTracker, STALE};
use super::rebalance::{TrackingContext, is_no_offset};
use super::transactions::Transactions;
use super::wire::{ATTEMPT_HEADER, TRACEPARENT_HEADER, TRACESTATE_HEADER, coordinated, transport};
use crate::telemetry::TraceHeaders;
use crate::topics::Topic;
use crate::topics::bus::{BusError, Delivery, DeliveryHooks, Record, Subscription};

/// Dropping it closes the channel its poller thread feeds, which ends that thread.
pub struct KafkaSubscription {
    pub(super) receiver: mpsc::Receiver<Delivery>,
    pub(super) consumer: Slot,
    /// Exactly-once: positions are committed in the process's transaction.
    pub(super) transactions: Option<Arc<Transactions>>,
}

#[async_trait]
impl Subscription for KafkaSubscription {
    async fn next(&mut self) -> Option<Delivery> {
        self.receiver.recv().await
    }

    async fn commit(&mut self) -> Result<(), BusError> {
        if let Some(transactions) = self.transactions.clone() {
            return tokio::task::spawn_blocking(move || transactions.commit()).await.map_err(transport);
        }
        let consumer = self.consumer.lock().unwrap().clone();
        tokio::task::spawn_blocking(move || match consumer.commit_consumer_state(CommitMode::Sync) {
            Err(error) if !is_no_offset(&error) => Err(transport(error)),
            _ => Ok(()),
        })
        .await
        .map_err(transport)?
    }
}

/// Why the broker refused an output of each record (by topic, partition and offset) whose
/// transaction was then aborted: kept until the record is delivered again.
pub(super) type Refusals = Arc<Mutex<HashMap<(String, i32, i64), String>>>;

/// What a poller shares with the rest of the bus besides its consumer.
pub(super) struct Shared {
    pub(super) catch_up: Option<Arc<CatchUp>>,
    pub(super) claims: Option<Arc<Claims>>,
    pub(super) done_before: Option<Arc<DoneBefore>>,
    /// Exactly-once: woken after an aborted transaction, to seek back to the committed positions.
    pub(super) rewind: Arc<tokio::sync::Notify>,
    pub(super) refusals: Refusals,
    /// A group member's: how its consumer is made anew after a fence by its own rejoin.
    pub(super) anew: Option<Anew>,
}

/// Polls the consumer for as long as the subscription lives. Records go to a bounded channel; when
/// the stage does not take them, each partition with a record waiting is paused (what was already
/// fetched waits in a small queue) and polling goes on, which keeps the consumer in its group.
pub(super) async fn poll(
    mut consumer: Arc<StreamConsumer<TrackingContext>>,
    tracker: Arc<Mutex<OffsetTracker>>,
    topic_of: HashMap<String, Topic>,
    sender: mpsc::Sender<Delivery>,
    (paused_gauge, waiting_gauge): (prometheus::IntGauge, prometheus::IntGauge),
    shared: Shared,
) {
    let name_of: HashMap<Topic, String> = topic_of.iter().map(|(name, topic)| (*topic, name.clone())).collect();
    let mut waiting: VecDeque<Delivery> = VecDeque::new();
    let mut paused = Paused::default();
    loop {
        if tracker.lock().unwrap().rewinding() {
            if let Err(error) = seek_back(&consumer, &tracker, &mut waiting, shared.claims.as_deref()) {
                // Reading on from where it is would skip what the aborted transaction had done.
                tracing::error!(%error, "cannot seek back to the last commit after an aborted transaction: the feed ends");
                return;
            }
            continue;
        }
        let fault = if let Some(delivery) = waiting.pop_front() {
            match sender.try_send(delivery) {
                Ok(()) => continue,
                Err(mpsc::error::TrySendError::Closed(_)) => return,
                Err(mpsc::error::TrySendError::Full(delivery)) => waiting.push_front(delivery),
            }
            // Again at each turn: a partition is paused once a record of it waits (one assigned
            // since, bringing a peer's backlog, included), and resumed once none does.
            paused_gauge.set(paused.follow(&consumer, partitions_of(&waiting, &name_of)));
            waiting_gauge.set(waiting.len() as i64);
            tokio::select! {
                permit = sender.reserve() => match permit {
                    Ok(permit) => {
                        permit.send(waiting.pop_front().expect("a waiting delivery"));
                        Fault::No
                    }
                    Err(_) => return,
                },
                message = consumer.recv() => received(&consumer, &tracker, &topic_of, &shared, &mut waiting, message),
                _ = shared.rewind.notified() => Fault::No,
            }
        } else {
            waiting_gauge.set(0);
            paused_gauge.set(paused.follow(&consumer, HashSet::new()));
            tokio::select! {
                message = consumer.recv() => received(&consumer, &tracker, &topic_of, &shared, &mut waiting, message),
                _ = shared.rewind.notified() => Fault::No,
                _ = sender.closed() => return,
            }
        };
        match fault {
            Fault::No => {}
            Fault::Ends => return,
            Fault::OwnRejoin => {
                let Some(anew) = &shared.anew else { return };
                // Fetched by the fenced consumer, whose assignment is gone: their owners read them.
                for delivery in waiting.drain(..) {
                    delivery.let_go();
                }
                match anew.replace() {
                    Ok(made) => {
                        consumer = made;
                        paused = Paused::default();
                        tracing::info!("the fenced Kafka consumer was made anew: it rejoins its group");
                    }
                    Err(error) => {
                        tracing::error!(%error, "cannot make the fenced Kafka consumer anew: its feed ends");
                        return;
                    }
                }
            }
        }
    }
}

/// What a poll's error leaves of the consumer.
enum Fault {
    No,
    /// Fenced by its own rejoin after its assignment was lost (`fenced.rs`): made anew.
    OwnRejoin,
    /// It can never consume again: the feed ends.
    Ends,
}

/// A polled message: a delivery queued, or the fault that ends the consumer.
fn received(
    consumer: &Arc<StreamConsumer<TrackingContext>>,
    tracker: &Arc<Mutex<OffsetTracker>>,
    topic_of: &HashMap<String, Topic>,
    shared: &Shared,
    waiting: &mut VecDeque<Delivery>,
    message: Result<rdkafka::message::BorrowedMessage<'_>, KafkaError>,
) -> Fault {
    let Some(reason) = fatal(consumer, &message) else {
        match to_delivery(consumer, tracker, topic_of, shared, message) {
            Some(Ok(delivery)) => waiting.push_back(delivery),
            Some(Err(error)) => {
                tracing::error!(
                    %error,
                    "cannot read which records the last commit lists as done: the feed ends, so that a restart \
                     reads them again instead of redoing work whose outputs are committed"
                );
                return Fault::Ends;
            }
            None => {}
        }
        return Fault::No;
    };
    if shared.anew.is_some() && fenced::by_its_own_rejoin(consumer) {
        tracing::warn!(%reason, "the Kafka consumer was fenced by its own rejoin after its assignment was lost");
        return Fault::OwnRejoin;
    }
    tracing::error!(%reason, "the Kafka consumer hit a fatal error and cannot consume again: its feed ends");
    Fault::Ends
}

/// Why the consumer can no longer consume, if it cannot: a fatal error (a static member fenced by
/// another process with its `kafka.instance_id`, say) is never cleared, so polling on would keep the
/// stage ready and idle for good. The poller ends instead: the subscription closes, the stage fails
/// and `/readyz` says so, and its records go to whichever member owns their partitions now.
fn fatal(
    consumer: &StreamConsumer<TrackingContext>,
    message: &Result<rdkafka::message::BorrowedMessage<'_>, KafkaError>,
) -> Option<String> {
    let Err(error) = message else { return None };
    let fatal = matches!(error, KafkaError::MessageConsumptionFatal(_)) || consumer.client().fatal_error().is_some();
    fatal.then(|| {
        consumer
            .client()
            .fatal_error()
            .map_or_else(|| error.to_string(), |(code, reason)| format!("{code:?}: {reason}"))
    })
}

/// After an aborted transaction: lets go of what waits here (fetched before the abort), seeks every
/// assigned partition back to its committed position (its start where none is), lets the claims go
/// of what was started, and tells the tracker that what is fetched from now on is work again.
/// librdkafka drops what it had fetched before a seek, so nothing from before it comes after.
fn seek_back(
    consumer: &StreamConsumer<TrackingContext>,
    tracker: &Mutex<OffsetTracker>,
    waiting: &mut VecDeque<Delivery>,
    claims: Option<&Claims>,
) -> Result<(), KafkaError> {
    for delivery in waiting.drain(..) {
        delivery.let_go();
    }
    let timeout = std::time::Duration::from_secs(10);
    let assignment = consumer.assignment()?;
    let mut positions = TopicPartitionList::new();
    if assignment.count() > 0 {
        // Asked again while the group's coordinator moves or loads: an abort right after a node
        // was lost.
        let committed = coordinated(|left| consumer.committed_offsets(assignment.clone(), left))?;
        for element in committed.elements() {
            // A partition whose position the broker did not give is not one to read from its start.
            element.error()?;
            let offset = match element.offset() {
                Offset::Offset(offset) => Offset::Offset(offset),
                _ => Offset::Beginning,
            };
            positions.add_partition_offset(element.topic(), element.partition(), offset)?;
        }
        for element in consumer.seek_partitions(positions.clone(), timeout)?.elements() {
            element.error()?;
        }
    }
    if let Some(claims) = claims {
        claims.release_all();
    }
    tracker.lock().unwrap().rewound();
    tracing::info!(partitions = positions.count(), "sought back to the last commit after an aborted transaction");
    Ok(())
}

/// The partitions that have a record waiting for the stage.
fn partitions_of(waiting: &VecDeque<Delivery>, name_of: &HashMap<Topic, String>) -> HashSet<(String, i32)> {
    waiting
        .iter()
        .filter_map(|delivery| Some((name_of.get(&delivery.record.topic)?.clone(), delivery.position?.0)))
        .collect()
}

/// The partitions a full stage paused: each while a record of it waits for the stage. Pausing
/// them all at once, and resuming them all as the stage took one record, made every resume fetch
/// again, and the partition whose fetch came back first won every turn: a slow stage read one
/// partition and starved the others. Paused one by one, the records waiting are about one per
/// partition, and they go to the stage in the order they came.
///
/// They are resumed as they were paused, not as they are assigned at that moment: librdkafka keeps
/// a partition's pause through its revocation, so one revoked meanwhile (a rebalance, a group that
/// rejoins after a broker restart) would come back paused and never be read again.
#[derive(Default)]
struct Paused(HashSet<(String, i32)>);

impl Paused {
    /// Pauses the partitions in `waiting` not paused yet and resumes the paused ones not in it;
    /// returns how many are paused.
    fn follow(&mut self, consumer: &StreamConsumer<TrackingContext>, waiting: HashSet<(String, i32)>) -> i64 {
        // The usual case at every record (nothing paused, nothing waiting, or no change): no call.
        if waiting == self.0 {
            return self.0.len() as i64;
        }
        let list = |partitions: &mut dyn Iterator<Item = &(String, i32)>| {
            let mut list = TopicPartitionList::new();
            for (topic, partition) in partitions {
                list.add_partition(topic, *partition);
            }
            list
        };
        let fresh = list(&mut waiting.difference(&self.0));
        if fresh.count() > 0
            && let Err(error) = consumer.pause(&fresh)
        {
            tracing::warn!(%error, "cannot pause partitions");
        }
        let done = list(&mut self.0.difference(&waiting));
        // Partitions librdkafka no longer knows are skipped, each with its error in the list.
        if done.count() > 0
            && let Err(error) = consumer.resume(&done)
        {
            tracing::warn!(%error, "cannot resume partitions");
        }
        self.0 = waiting;
        self.0.len() as i64
    }
}

fn to_delivery(
    consumer: &Arc<StreamConsumer<TrackingContext>>,
    tracker: &Arc<Mutex<OffsetTracker>>,
    topic_of: &HashMap<String, Topic>,
    shared: &Shared,
    message: Result<rdkafka::message::BorrowedMessage<'_>, KafkaError>,
) -> Option<Result<Delivery, KafkaError>> {
    let Shared { catch_up, claims, done_before, refusals, .. } = shared;
    let message = match message {
        Ok(message) => message,
        // Only a follower asks to be told (`enable.partition.eof`): it reads one topic.
        Err(KafkaError::PartitionEOF(partition)) => {
            if let Some(catch_up) = catch_up {
                catch_up.end_of(partition);
            }
            return None;
        }
        Err(error) => {
            tracing::warn!(%error, "kafka consumer error");
            return None;
        }
    };
    let (name, partition, offset) = (message.topic().to_string(), message.partition(), message.offset());
    let topic = *topic_of.get(&name)?;
    let key = message.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
    let header = |name: &str| {
        let headers = message.headers()?;
        let header = headers.iter().find(|h| h.key == name)?;
        std::str::from_utf8(header.value?).ok().map(str::to_string)
    };
    let attempt = header(ATTEMPT_HEADER).and_then(|a| a.parse().ok()).unwrap_or(1);
    let trace = TraceHeaders { traceparent: header(TRACEPARENT_HEADER), tracestate: header(TRACESTATE_HEADER) };
    let payload = message.payload().unwrap_or_default().to_vec();
    let assignment = tracker.lock().unwrap().register(&name, partition, offset);
    if assignment == STALE {
        // Fetched between an abort and the seek back: it comes again after the seek.
        return None;
    }
    if let Some(catch_up) = catch_up {
        catch_up.fetched(&name, partition, offset);
    }
    // Finished by an earlier owner, its outputs committed with the position before it: skipped.
    if let Some(done) = done_before {
        match done.contains(consumer, (&name, partition, offset), assignment) {
            Ok(true) => {
                tracing::debug!(topic = %name, partition, offset, "done before the last commit: skipped");
                tracker.lock().unwrap().ack(&name, partition, offset, assignment);
                return None;
            }
            Ok(false) => {}
            Err(error) => return Some(Err(error)),
        }
    }
    let (consumer, claim_tracker, owned_tracker, tracker, claim_name, owned_name) =
        (consumer.clone(), tracker.clone(), tracker.clone(), tracker.clone(), name.clone(), name.clone());
    let (claims, start_claims, done_claims) = (claims.clone(), claims.clone(), claims.clone());
    let start_name = name.clone();
    let claim = Box::new(move || {
        if !claim_tracker.lock().unwrap().claim(&claim_name, partition, offset, assignment) {
            return None;
        }
        Some(claims.as_ref().map_or(0, |claims| claims.earlier(&claim_name, partition, offset)))
    });
    // Counted on the broker before the work starts, so that a crash during it counts.
    let start = Box::new(move |starts| {
        if let Some(claims) = &start_claims {
            claims.start(&start_name, partition, offset, starts);
        }
    });
    let owned = Box::new(move || owned_tracker.lock().unwrap().owns(&owned_name, partition, offset, assignment));
    let refused_before = refusals.lock().unwrap().remove(&(name.clone(), partition, offset));
    let (refusals, refused_name) = (refusals.clone(), name.clone());
    let refused = Box::new(move |reason: String| {
        refusals.lock().unwrap().insert((refused_name, partition, offset), reason);
    });
    let catch_up = catch_up.clone();
    let ack = Box::new(move || {
        if let Some(catch_up) = &catch_up {
            catch_up.acked(&name, partition, offset);
        }
        if let Some(claims) = &done_claims {
            claims.done(&name, partition, offset);
        }
        let store = tracker.lock().unwrap().ack(&name, partition, offset, assignment);
        if let Some(next) = store
            && let Err(error) = consumer.store_offset(&name, partition, next - 1)
        {
            tracing::debug!(%error, "offset not stored (partition moved away)");
        }
    });
    Some(Ok(Delivery::new(
        Record { topic, key, payload, trace },
        attempt,
        Some(DeliveryHooks { claim, start, owned, ack, refused }),
    )
    .at(partition, offset)
    .refused_before(refused_before)))
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    use rdkafka::{Message, Offset, TopicPartitionList};

    use super::super::offsets::OffsetTracker;
    use super::super::rebalance::{TrackingContext, context_for_tests};
    use super::super::wire::OffsetNotes;
    use super::seek_back;

    /// After an aborted transaction every assigned partition is sought back to its committed
    /// position. Right after a node is lost, the read of those positions is answered *not
    /// coordinator* while the group's coordinator moves, and the feed ended (the process exits)
    /// though the positions were there to read a moment later. On librdkafka's mock cluster: the
    /// commit at 2 of three records, the read answered *not coordinator*, then *loading*.
    #[tokio::test]
    async fn seeking_back_while_the_coordinator_moves_asks_again() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("t", 1, 1).unwrap();
        let base = ClientConfig::new().set("bootstrap.servers", cluster.bootstrap_servers()).clone();
        let producer: BaseProducer = base.create().unwrap();
        for key in ["a", "b", "c"] {
            producer.send(BaseRecord::<str, str>::to("t").key(key).payload(key)).unwrap();
        }
        producer.flush(std::time::Duration::from_secs(10)).unwrap();
        OffsetNotes::new(&base, "g").unwrap().write("t", 0, 2, String::new()).unwrap();
        let tracker = Arc::new(Mutex::new(OffsetTracker::default()));
        let consumer: StreamConsumer<TrackingContext> =
            base.clone().set("group.id", "g").create_with_context(context_for_tests(tracker.clone())).unwrap();
        let mut assigned = TopicPartitionList::new();
        assigned.add_partition_offset("t", 0, Offset::Offset(0)).unwrap();
        consumer.assign(&assigned).unwrap();
        use RDKafkaRespErr::*;
        let moving = [RD_KAFKA_RESP_ERR_NOT_COORDINATOR, RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS];
        cluster.request_errors(RDKafkaApiKey::OffsetFetch, &moving);
        let sought = seek_back(&consumer, &tracker, &mut VecDeque::new(), None);
        assert!(sought.is_ok(), "the feed would end: {sought:?}");
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), consumer.recv()).await;
        let offset = next.expect("a record in 10 s").expect("a record").offset();
        assert_eq!(offset, 2, "the first record read after seeking back is the one at the commit");
    }
}
