//! A group member's consumer fenced by its own rejoin. A static member (`kafka.instance_id`) whose
//! session timed out while a broker was away loses its assignment and rejoins, and the broker can
//! answer the rejoin as if another process held its instance id (librdkafka#3437): a fatal error,
//! after which that consumer never consumes again.

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
