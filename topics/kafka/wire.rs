//! What every file of the Kafka bus shares: the headers our records carry, how a librdkafka error
//! becomes a [`BusError`] (transient, or a rejection no retry can mend), and notes kept on the
//! broker as the metadata of committed offsets.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use crate::topics::bus::BusError;

pub const ATTEMPT_HEADER: &str = "lacuna-attempt";
pub const QUESTION_HEADER: &str = "lacuna-question-id";
/// The W3C trace context (https://www.w3.org/TR/trace-context/), under its own names so that any
/// instrumented Kafka client can follow a question's trace.
pub const TRACEPARENT_HEADER: &str = "traceparent";
pub const TRACESTATE_HEADER: &str = "tracestate";

pub(super) fn transport(error: impl std::fmt::Display) -> BusError {
    BusError::Transport(error.to_string())
}

/// Errors no retry can fix are rejections; the rest (timeouts, leader changes, a broker away) are
/// transient.
pub(super) fn publish_error(error: KafkaError) -> BusError {
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

/// Notes kept on the broker, so they outlive the process: the metadata of offsets committed by a
/// consumer group that never joins (`claims`' record starts, `lineage`'s transactional id).
pub(super) struct OffsetNotes(BaseConsumer);

impl OffsetNotes {
    pub(super) fn new(base: &ClientConfig, group: &str) -> KafkaResult<OffsetNotes> {
        base.clone().set("group.id", group).set("enable.auto.commit", "false").create().map(OffsetNotes)
    }

    /// Keeps `note` with `offset` of the partition, in place of the one before.
    pub(super) fn write(&self, topic: &str, partition: i32, offset: i64, note: String) -> KafkaResult<()> {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        list.find_partition(topic, partition).expect("just added").set_metadata(note);
        coordinated(|_| self.0.commit(&list, CommitMode::Sync))
    }

    /// The note kept for the partition, empty when there is none.
    pub(super) fn read(&self, topic: &str, partition: i32) -> KafkaResult<String> {
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, partition);
        let committed = coordinated(|left| self.0.committed_offsets(list.clone(), left))?;
        Ok(committed.find_partition(topic, partition).map(|element| element.metadata().to_string()).unwrap_or_default())
    }
}

/// How long a note's read or write may take, coordinator moves included.
pub(super) const NOTE_TIMEOUT: Duration = Duration::from_secs(10);

/// Calls `ask` with the time left, again while the group's coordinator is moving or still loading
/// (a cluster just started, a node restarted): librdkafka hands those answers back as they are.
pub(super) fn coordinated<T>(mut ask: impl FnMut(Duration) -> KafkaResult<T>) -> KafkaResult<T> {
    let moving = |code| {
        matches!(
            code,
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
        )
    };
    asked_again_while(NOTE_TIMEOUT, moving, |left| ask(left).map_err(|error| (error.rdkafka_error_code(), error)))
}

/// How long to wait before asking again: an election or a coordinator's move takes tens of
/// milliseconds.
const AGAIN_AFTER: Duration = Duration::from_millis(100);

/// Calls `ask` with the time left until it answers, or fails with a code `passing` does not take
/// for a passing state, or the time is up; the last failure is then the error. What asks again
/// while leaders are elected (`leaders`) and while a group's coordinator moves (notes, above).
pub(super) fn asked_again_while<T, E>(
    timeout: Duration,
    passing: impl Fn(RDKafkaErrorCode) -> bool,
    mut ask: impl FnMut(Duration) -> Result<T, (Option<RDKafkaErrorCode>, E)>,
) -> Result<T, E> {
    let give_up = Instant::now() + timeout;
    loop {
        match ask(give_up.saturating_duration_since(Instant::now())) {
            Err((Some(code), _)) if passing(code) && Instant::now() + AGAIN_AFTER < give_up => {
                tracing::debug!(%code, "not settled yet: asking again");
                std::thread::sleep(AGAIN_AFTER);
            }
            answer => return answer.map_err(|(_, error)| error),
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::*;

    /// Found by the first soak on three Apache Kafka nodes (2026-12-06): a stage process started
    /// with the cluster read its transactional lineage while the group coordinator was still
    /// loading, was answered NotCoordinator, and exited. Notes are asked again while the
    /// coordinator moves or loads.
    #[test]
    fn notes_are_asked_again_while_the_group_coordinator_loads() {
        let cluster = MockCluster::new(1).unwrap();
        cluster.create_topic("t", 1, 1).unwrap();
        let base = ClientConfig::new().set("bootstrap.servers", cluster.bootstrap_servers()).clone();
        let notes = OffsetNotes::new(&base, "notes").unwrap();
        notes.write("t", 0, 3, "kept".into()).unwrap();
        use RDKafkaRespErr::*;
        let loading = [RD_KAFKA_RESP_ERR_NOT_COORDINATOR, RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS];
        cluster.request_errors(RDKafkaApiKey::OffsetFetch, &loading);
        assert_eq!(notes.read("t", 0).expect("asked again"), "kept");
        cluster.request_errors(RDKafkaApiKey::OffsetCommit, &loading);
        notes.write("t", 0, 4, "again".into()).expect("asked again");
        assert_eq!(notes.read("t", 0).unwrap(), "again");
    }
}
