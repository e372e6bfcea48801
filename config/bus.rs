//! The bus (`[bus]`), Kafka (`[kafka]`), and how each stage runs on it (`[retry]`, `[stages.NAME]`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BusSettings {
    pub queue_capacity: usize,
    /// The largest event published, on either bus (Kafka's `message.max.bytes`).
    pub max_event_bytes: usize,
    /// The event schema written to Kafka: this build's (0), or the previous one while replicas of
    /// the previous build still run (see `topics/schema.rs`).
    pub write_schema_version: u32,
    /// Events each stage remembers having finished, to skip repeats (`actors/dedupe.rs`); 0: off.
    pub dedupe_window: usize,
    /// Stages publish the trace steps they add to the `progress` topic (for `lacuna serve`).
    pub progress: bool,
    /// The longest a stage waits to publish one progress record before dropping it.
    pub progress_timeout_ms: u64,
    /// What Kafka promises of each consumed record's outputs (`topics/kafka/transactions.rs`).
    pub delivery: DeliveryGuarantee,
}

/// `bus.delivery`. The in-process bus ignores it: its queues live and die with the process.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryGuarantee {
    /// Outputs published, then the offset committed: a crash between the two publishes them again,
    /// and readers drop the repeats (`dedupe_window`, the sink, serve).
    AtLeastOnce,
    /// Outputs and offsets committed in one Kafka transaction; readers see only committed ones.
    ExactlyOnce,
}

impl BusSettings {
    /// How long a stage may wait to publish one progress record; `None` when progress is off.
    pub fn progress_timeout(&self) -> Option<std::time::Duration> {
        self.progress.then(|| std::time::Duration::from_millis(self.progress_timeout_ms))
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub brokers: String,
    pub topic_prefix: String,
    pub partitions: i32,
    pub replication_factor: i32,
    pub session_timeout_ms: u64,
    pub max_poll_interval_ms: u64,
    pub instance_id: String,
    pub message_timeout_ms: u64,
    pub prefetch: usize,
    /// How long a revocation waits for the revoked partitions' started work before letting them go.
    pub drain_timeout_ms: u64,
    /// Exactly-once: how often a stage process commits its transaction (outputs and positions).
    pub transaction_interval_ms: u64,
    /// Exactly-once: a transaction left open this long (its process died) is aborted by the broker.
    pub transaction_timeout_ms: u64,
    /// How long the documents topic keeps tombstones, for when the broker does not say (DescribeConfigs
    /// not granted); 0: read from the topic, and a follower that cannot read it refuses to resume.
    #[serde(default)]
    pub documents_delete_retention_ms: u64,
    /// Any librdkafka property, set on every client (TLS, SASL mechanism and user, timeouts), as
    /// `property=value` (a list of strings: the config loader splits table keys at dots).
    #[serde(default)]
    pub properties: Vec<String>,
    /// librdkafka properties whose values are secrets, as `property=ENVIRONMENT_VARIABLE`.
    #[serde(default)]
    pub secret_properties: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    pub max_attempts: u32,
    pub backoff_ms: u64,
    /// Attempts per publish on transient bus errors, with the same backoff.
    pub publish_attempts: u32,
}

/// How one stage runs. Its declaration (`pipelines/`) gives the defaults; `[stages.NAME]` may
/// override them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageSettings {
    /// Events processed at once: the stage's one bound on taken, unfinished work. Never below
    /// `llm_concurrency`, so every LLM slot can be in use.
    pub max_in_flight: usize,
    /// LLM calls in flight at once.
    pub llm_concurrency: usize,
}

impl StageSettings {
    /// A stage that calls the LLM.
    pub const LLM: StageSettings = StageSettings { max_in_flight: 8, llm_concurrency: 2 };

    /// These defaults with `overrides` applied.
    pub fn with(self, overrides: Option<&StageOverrides>) -> StageSettings {
        let Some(overrides) = overrides else { return self };
        StageSettings {
            max_in_flight: overrides.max_in_flight.unwrap_or(self.max_in_flight),
            llm_concurrency: overrides.llm_concurrency.unwrap_or(self.llm_concurrency),
        }
    }
}

/// `[stages.NAME]`: what a deployment changes of a stage's declared [`StageSettings`].
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StageOverrides {
    pub max_in_flight: Option<usize>,
    pub llm_concurrency: Option<usize>,
}
