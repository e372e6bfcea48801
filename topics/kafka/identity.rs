//! Which topic a stored offset belongs to: the cluster's id and the topic's id (KIP-516), so that
//! positions kept outside Kafka (the answers sink's `.positions`, a replica's index) are never read
//! against a topic of the same name deleted and created again, or another cluster's. Offsets alone
//! cannot tell: a recreated topic starts again at 0 and soon grows past them.
//!
//! rdkafka 0.39 wraps neither DescribeTopics nor the topic id, so this calls librdkafka's C API
//! (2.12, linked by rdkafka-sys) directly, on a queue of its own, as rdkafka's admin client does.

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};

use super::leaders::asked_again;
use crate::topics::bus::BusError;

/// A topic as the broker knows it. Stored beside positions; compared whole.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicIdentity {
    /// The cluster's id (`cluster.id`; KRaft formats it into every node's storage).
    pub cluster: String,
    /// The topic's id, 32 hex digits: a new one each time a topic of that name is created.
    pub topic_id: String,
}

impl std::fmt::Display for TopicIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cluster {} topic id {}", self.cluster, self.topic_id)
    }
}

/// The identity of `topic` on the cluster `client` talks to, asked again while a topic just
/// created is not described yet. A broker older than topic ids (before Kafka 2.8) answers none:
/// that is an error, since nothing else would tell a recreated topic from the one stored.
pub(super) fn identify<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Result<TopicIdentity, BusError> {
    let cluster = client.fetch_cluster_id(timeout).ok_or_else(|| {
        BusError::Transport(format!("cannot read the cluster id within {timeout:?} (is a broker up?)"))
    })?;
    let topic_id = asked_again(timeout, |left| describe(client, topic, left))?;
    Ok(TopicIdentity { cluster, topic_id })
}

/// One DescribeTopics request for `topic`: its id, or the error code and why.
fn describe<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Result<String, (Option<RDKafkaErrorCode>, BusError)> {
    let failed = |code: RDKafkaErrorCode, why: String| {
        (Some(code), BusError::Transport(format!("describing topic {topic}: {code}: {why}")))
    };
    let name = CString::new(topic).map_err(|e| (None, BusError::Config(e.to_string())))?;
    let timeout_ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: every pointer comes from librdkafka and is destroyed once, after its last use here;
    // the description, its error and its id are owned by the event, read before it is destroyed.
    unsafe {
        let rk = client.native_ptr();
        let queue = rd::rd_kafka_queue_new(rk);
        let options = rd::rd_kafka_AdminOptions_new(rk, rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS);
        let mut errstr = [0 as std::ffi::c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(options, timeout_ms, errstr.as_mut_ptr(), errstr.len());
        let mut names = [name.as_ptr()];
        let topics = rd::rd_kafka_TopicCollection_of_topic_names(names.as_mut_ptr(), 1);
        rd::rd_kafka_DescribeTopics(rk, topics, options, queue);
        // The request's own timeout ends it first; the margin only bounds a librdkafka that never answers.
        let event = rd::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(5_000));
        let answer = if event.is_null() {
            Err(failed(RDKafkaErrorCode::RequestTimedOut, "no answer".into()))
        } else {
            read_answer(event, failed)
        };
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_TopicCollection_destroy(topics);
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_queue_destroy(queue);
        answer
    }
}

/// The topic id a DescribeTopics result event holds.
///
/// # Safety
/// `event` is a live DescribeTopics result event.
unsafe fn read_answer(
    event: *mut rd::rd_kafka_event_t,
    failed: impl Fn(RDKafkaErrorCode, String) -> (Option<RDKafkaErrorCode>, BusError),
) -> Result<String, (Option<RDKafkaErrorCode>, BusError)> {
    // SAFETY: the caller's event owns everything read here, and outlives this call.
    unsafe {
        let text = |s: *const std::ffi::c_char| {
            if s.is_null() { String::new() } else { CStr::from_ptr(s).to_string_lossy().into_owned() }
        };
        let code = RDKafkaErrorCode::from(rd::rd_kafka_event_error(event));
        if code != RDKafkaErrorCode::NoError {
            return Err(failed(code, text(rd::rd_kafka_event_error_string(event))));
        }
        let result = rd::rd_kafka_event_DescribeTopics_result(event);
        let mut count = 0usize;
        let descriptions = if result.is_null() {
            std::ptr::null_mut()
        } else {
            rd::rd_kafka_DescribeTopics_result_topics(result, &mut count)
        };
        if descriptions.is_null() || count == 0 {
            return Err(failed(RDKafkaErrorCode::UnknownTopicOrPartition, "not described".into()));
        }
        let description = *descriptions;
        let error = rd::rd_kafka_TopicDescription_error(description);
        if !error.is_null() {
            let code = RDKafkaErrorCode::from(rd::rd_kafka_error_code(error));
            if code != RDKafkaErrorCode::NoError {
                return Err(failed(code, text(rd::rd_kafka_error_string(error))));
            }
        }
        let id = rd::rd_kafka_TopicDescription_topic_id(description);
        let (high, low) = if id.is_null() {
            (0, 0)
        } else {
            (rd::rd_kafka_Uuid_most_significant_bits(id), rd::rd_kafka_Uuid_least_significant_bits(id))
        };
        if (high, low) == (0, 0) {
            // Not a wait: a broker before Kafka 2.8 never gives one.
            return Err((
                None,
                BusError::Transport("the broker gives topics no id (Kafka 2.8 or later needed)".into()),
            ));
        }
        Ok(format!("{:016x}{:016x}", high as u64, low as u64))
    }
}
