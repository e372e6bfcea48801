//! What every file of the Kafka bus shares: the headers our records carry, and how a librdkafka
//! error becomes a [`BusError`] (transient, or a rejection no retry can mend).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::topics::bus::BusError;

pub const ATTEMPT_HEADER: &str = "lacuna-attempt";
pub const QUESTION_HEADER: &str = "lacuna-question-id";

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
