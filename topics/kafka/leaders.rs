//! A topic's partitions and their watermarks, asked again while leaders are still being elected.
//!
//! Apache Kafka creates a topic before its partitions have leaders, and moves leadership when a
//! node stops: for a moment, metadata lists a partition without a leader (or not at all) and a
//! watermark request is answered NotLeaderForPartition. librdkafka hands those answers back as they
//! are. A start-up that reads a topic then (a serve replica's catch-up, the join's state, the
//! documents' spans) waits for the leaders, up to its timeout, instead of failing or, worse, reading
//! no partitions at all.

use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::RDKafkaErrorCode;

use super::wire::{asked_again_while, transport};
use crate::topics::bus::BusError;

/// Answers that mean "not yet" while a topic is new or its leadership moves.
fn settling(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::NotLeaderForPartition
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::NotCoordinator
            | RDKafkaErrorCode::FencedLeaderEpoch
            | RDKafkaErrorCode::UnknownLeaderEpoch
            | RDKafkaErrorCode::OffsetNotAvailable
    )
}

/// Calls `ask` again while it fails in a way that is [`settling`], up to `timeout`
/// ([`asked_again_while`]). The three reads below differ only in `ask`.
pub(super) fn asked_again<T>(
    timeout: Duration,
    ask: impl FnMut(Duration) -> Result<T, (Option<RDKafkaErrorCode>, BusError)>,
) -> Result<T, BusError> {
    asked_again_while(timeout, settling, ask)
}

/// The ids of `topic`'s partitions, once every one of them has a leader.
pub(super) fn partitions<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<i32>, BusError> {
    let not_ready = |why: String| {
        let message = format!("topic {topic} is not ready after {timeout:?}: {why} (is it created? is a broker up?)");
        (Some(RDKafkaErrorCode::LeaderNotAvailable), BusError::Transport(message))
    };
    asked_again(timeout, |left| {
        let metadata = consumer.fetch_metadata(Some(topic), left).map_err(|e| (None, transport(e)))?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err(not_ready("not listed".into()));
        };
        match found.error().map(RDKafkaErrorCode::from) {
            Some(code) if settling(code) => return Err(not_ready(code.to_string())),
            Some(code) => return Err((None, BusError::Transport(format!("topic {topic}: {code}")))),
            None if found.partitions().is_empty() => return Err(not_ready("no partitions yet".into())),
            None => {}
        }
        // A replica away (ReplicaNotAvailable) leaves the partition led: not a wait.
        let leaderless = found
            .partitions()
            .iter()
            .find(|p| p.leader() < 0 || p.error().map(RDKafkaErrorCode::from).is_some_and(settling));
        match leaderless {
            Some(p) => Err(not_ready(format!("partition {} has no leader", p.id()))),
            None => Ok(found.partitions().iter().map(|p| p.id()).collect()),
        }
    })
}

/// The low and high watermarks of one partition, asked again while its leader is being elected.
pub(super) fn watermarks<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<(i64, i64), BusError> {
    asked_again(timeout, |left| {
        consumer
            .fetch_watermarks(topic, partition, left)
            .map_err(|error| (error.rdkafka_error_code(), transport(error)))
    })
}

/// The first offset at or after each partition's time in `at_time`, asked again while a partition's
/// leader is being elected: a partition answered with an error would otherwise read as one with no
/// record since then, and a replica would skip its whole replay window there.
pub(super) fn offsets_for_times<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    at_time: TopicPartitionList,
    timeout: Duration,
) -> Result<TopicPartitionList, BusError> {
    asked_again(timeout, |left| {
        // The whole request fails when its partitions' leaders are not known yet; one partition's
        // element fails when its leader moved.
        let error = match consumer.offsets_for_times(at_time.clone(), left) {
            Err(error) => error,
            Ok(found) => match found.elements().iter().find_map(|e| e.error().err()) {
                Some(error) => error,
                None => return Ok(found),
            },
        };
        Err((error.rdkafka_error_code(), BusError::Transport(format!("offsets by time: {error}"))))
    })
}

#[cfg(test)]
mod tests {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::BaseConsumer;
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::*;

    /// A serve replica asks where its replay window starts right after Apache Kafka created the
    /// topic: the whole request is answered NotLeaderForPartition until the leader is elected.
    #[test]
    fn offsets_by_time_are_asked_again_until_the_leader_is_elected() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("answers", 2, 1).unwrap();
        let consumer: BaseConsumer =
            ClientConfig::new().set("bootstrap.servers", cluster.bootstrap_servers()).create().unwrap();
        let not_leader = RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION;
        cluster.request_errors(RDKafkaApiKey::ListOffsets, &[not_leader; 3]);
        let mut at_time = TopicPartitionList::new();
        for partition in partitions(&consumer, "answers", Duration::from_secs(10)).unwrap() {
            at_time.add_partition_offset("answers", partition, rdkafka::Offset::Offset(0)).unwrap();
        }
        let found = offsets_for_times(&consumer, at_time, Duration::from_secs(10)).expect("asked again");
        assert_eq!(found.count(), 2);
        assert!(found.elements().iter().all(|e| e.error().is_ok()));
    }
}
