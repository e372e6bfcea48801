//! `dead_letters`: events a stage gave up on, with the reason and the original record, so they can be
//! inspected and replayed. The question itself always gets an error record on `answers` too.

use serde::{Deserialize, Serialize};

use super::{Event, Record, Topic};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub schema_version: u32,
    pub stage: String,
    pub error_type: String,
    pub message: String,
    pub original_topic: Topic,
    pub key: String,
    /// The original payload as text (lossy only when it was not UTF-8).
    pub payload: String,
    /// The tries the stage made on the event, earlier dead-letter replays included: a replay is
    /// published with the next number in its `lacuna-attempt` header. (A redelivery after a crash is
    /// not counted: nothing recorded that the first delivery ever started.)
    #[serde(default)]
    pub attempts: u32,
    /// Set when the payload was cut to fit `bus.max_event_bytes`: it cannot be replayed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub payload_truncated: bool,
    /// The original record's trace context: a replay continues its question's trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl DeadLetter {
    pub fn new(stage: &str, error_type: &str, message: &str, original: &Record, attempts: u32) -> Self {
        DeadLetter {
            schema_version: super::SCHEMA_VERSION,
            stage: stage.to_string(),
            error_type: error_type.to_string(),
            message: message.to_string(),
            original_topic: original.topic,
            key: original.key.clone(),
            payload: String::from_utf8_lossy(&original.payload).into_owned(),
            attempts,
            payload_truncated: false,
            traceparent: original.trace.traceparent.clone(),
            tracestate: original.trace.tracestate.clone(),
        }
    }
}

impl Event for DeadLetter {
    const TOPIC: Topic = Topic::DeadLetters;
    fn key(&self) -> &str {
        &self.key
    }
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}
