//! A group member's consumer fenced by its own rejoin, made anew in place. A static member
//! (`kafka.instance_id`) whose session timed out while a broker was away loses its assignment and
//! rejoins, and the broker can answer the rejoin as if another process held its instance id
//! (librdkafka#3437): a fatal error, after which that consumer never consumes again. Nothing of it is
//! lost by then (the lost assignment let every record go: exactly-once aborted and rewound), so
//! the poller makes the consumer again, under the same group and instance id and on the same offset
//! tracker, instead of ending the stage's feed and the process with it.
//!
//! A fence that does not follow a lost assignment is a twin's: another process runs with this
//! `kafka.instance_id`. Taking the id back would fence the twin in turn, for ever, so that feed ends
//! and the stage fails, as before (finding 6 of issue 74).

use std::sync::{Arc, Mutex};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;

use super::offsets::OffsetTracker;
use super::rebalance::TrackingContext;
use super::transactions::Transactions;
use crate::topics::bus::BusError;

/// Makes a group member's consumer, subscribed to its topics, its context on the member's tracker.
pub(super) type Make = Box<dyn Fn() -> Result<StreamConsumer<TrackingContext>, BusError> + Send + Sync>;

/// The consumer a subscription commits through (at least once), replaced when it is made anew.
pub(super) type Slot = Arc<Mutex<Arc<StreamConsumer<TrackingContext>>>>;

/// What the poller needs to put a consumer fenced by its own rejoin back in its place.
pub(super) struct Anew {
    make: Make,
    tracker: Arc<Mutex<OffsetTracker>>,
    slot: Slot,
    transactions: Option<Arc<Transactions>>,
}

impl Anew {
    pub(super) fn new(
        make: Make,
        tracker: Arc<Mutex<OffsetTracker>>,
        slot: Slot,
        transactions: Option<Arc<Transactions>>,
    ) -> Anew {
        Anew { make, tracker, slot, transactions }
    }

    /// The consumer made again; the subscription's commits and the transactions' read it from now.
    pub(super) fn replace(&self) -> Result<Arc<StreamConsumer<TrackingContext>>, BusError> {
        let consumer = Arc::new((self.make)()?);
        if let Some(transactions) = &self.transactions {
            transactions.retrack(&self.tracker, Arc::downgrade(&consumer));
        }
        *self.slot.lock().unwrap() = consumer.clone();
        Ok(consumer)
    }
}

/// Whether the consumer's fatal error is a fence by its own rejoin: fenced for its instance id
/// after its assignment was lost, with none since.
pub(super) fn by_its_own_rejoin(consumer: &StreamConsumer<TrackingContext>) -> bool {
    consumer.client().fatal_error().is_some_and(|(code, _)| code == RDKafkaErrorCode::FencedInstanceId)
        && consumer.context().lost_since_assigned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use crate::config::{DeliveryGuarantee, Settings};
    use crate::topics::Topic;
    use crate::topics::bus::{Bus, Record};
    use crate::topics::kafka::KafkaBus;

    /// librdkafka#3437, on librdkafka's mock cluster: the member's heartbeat is answered *unknown
    /// member* (its session is gone: the assignment is lost), and its rejoin *fenced instance id*.
    /// The stage's feed must go on with a consumer made anew, not end (which exits the process).
    #[tokio::test]
    async fn a_consumer_fenced_by_its_own_rejoin_is_made_anew_and_reads_on() {
        let cluster = MockCluster::new(1).unwrap();
        let mut settings = Settings::load(None).unwrap();
        settings.kafka.brokers = cluster.bootstrap_servers();
        settings.kafka.topic_prefix = "own-fence.".into();
        settings.kafka.instance_id = "replica-0".into();
        settings.kafka.partitions = 1;
        settings.bus.delivery = DeliveryGuarantee::AtLeastOnce;
        cluster.create_topic("own-fence.missing", 1, 1).unwrap();
        let bus = KafkaBus::new(settings.kafka.clone(), &settings.bus).unwrap();
        let record = |key: &str| Record::new(Topic::Missing, key, b"{}".to_vec());
        let mut feed = bus.subscribe(&[Topic::Missing], "own-fence").await.unwrap();
        bus.publish(record("before")).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(30), feed.next()).await.unwrap().expect("a record");
        assert_eq!(first.record.key, "before");
        first.claim().expect("its own").ack();
        cluster.request_errors(RDKafkaApiKey::Heartbeat, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID]);
        cluster.request_errors(RDKafkaApiKey::JoinGroup, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID]);
        // The next heartbeat (3 s) finds the session gone, and the rejoin right after it is fenced.
        tokio::time::sleep(Duration::from_secs(8)).await;
        bus.publish(record("after")).await.unwrap();
        let after = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                match feed.next().await {
                    Some(delivery) if delivery.record.key == "after" => return Some(()),
                    Some(delivery) => delivery.let_go(),
                    None => return None,
                }
            }
        })
        .await;
        assert_eq!(after, Ok(Some(())), "Ok(None): the feed ended; Err: nothing in 60 s");
    }
}
