//! The events stages exchange, one file per topic, and the bus that carries them.
//!
//! Every event is JSON with a `schema_version`, keyed by question id, so the same bytes travel over
//! the in-process bus and over Kafka. Events that continue a question carry its whole [`Memory`]:
//! stages keep no state and any replica can take any event.
//!
//! The topics, one event each, in MIGRES's order:
//! - `question`: what users submit, the only event without memory.
//! - `passages`: BM25 hits for each query of the iteration, retrieve -> sentence_filter.
//! - `evidence`: the top-k filtered passages or sentences, sentence_filter -> leaf.
//! - `facts`: the facts the leaf extracted, each citing evidence, leaf -> verify.
//! - `verified`: a memory ready to be answered from (entailed facts added), verify -> main.
//! - `missing`: what main found missing, main -> query_gen.
//! - `queries`: new single-hop queries for the next iteration, query_gen -> retrieve.
//! - `answer`: exactly one record per question: an answer with its facts and passages, or an error.
//! - `dead_letter`: events a stage gave up on, with the reason, to inspect and replay.
//! - `node`: sub-questions (RA-ISF) and trajectories (RQ-RAG), each an event of its own.
//! - `joins`: fan-out registrations and children's results for the join, and its `join_state`.
//! - `progress`: the trace steps a stage just added, best effort, for `lacuna serve` to stream.
//!
//! What the events carry, and what carries them:
//! - `memory`: the question's memory between iterations: known facts, queries, passages, usage.
//! - `trace`: every query, score, fact, verdict and LLM call of a question, in order.
//! - `logprobs`: the log-probabilities of generated text (RQ-RAG's confidence, the first read's answer).
//! - `provenance`: what made an answer: build, pipeline, configuration and prompt hashes, models.
//! - `schema`: the event schema version this build writes and the ones it reads (rolling upgrades).
//! - `size`: an event trimmed under `bus.max_event_bytes`, its bulkiest trace parts first.
//! - `bus`: the [`Bus`] trait: publishes awaited (backpressure), deliveries acked once their outputs are.
//! - `in_process`: the embedded bus: a bounded channel per topic inside the process.
//! - `kafka/`: the production bus on Kafka, and the documents topic (the corpus's changelog).

pub mod answer;
pub mod bus;
pub mod dead_letter;
pub mod evidence;
pub mod facts;
pub mod in_process;
pub mod joins;
pub mod kafka;
pub mod logprobs;
pub mod memory;
pub mod missing;
pub mod node;
pub mod passages;
pub mod progress;
pub mod provenance;
pub mod queries;
pub mod question;
pub mod schema;
pub mod size;
pub mod trace;
pub mod verified;

pub use answer::{AnswerRecord, Answered, ErrorRecord, Outcome, VersionedAnswer};
pub use bus::{Bus, BusError, Delivery, Record, Subscription, Transaction};
pub use evidence::EvidenceEvent;
pub use facts::{CandidateFact, FactsEvent};
pub use joins::{JoinEvent, JoinedEvent};
pub use logprobs::AnswerLogprobs;
pub use memory::{
    EvidenceItem, EvidenceOrigin, FactSource, KnownFact, Memory, NodeRef, OneShot, Passage, ScoredPassage,
    TrajectoryStep, Usage,
};
pub use missing::MissingEvent;
pub use node::{Candidate, NodeEvent, NodeResult};
pub use passages::{PassagesEvent, RetrievedPassage};
pub use progress::ProgressEvent;
pub use provenance::Provenance;
pub use queries::QueriesEvent;
pub use question::QuestionEvent;
pub use trace::{TraceKind, TraceStep};
pub use verified::VerifiedEvent;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use schema::{OLDEST_READABLE_SCHEMA_VERSION, SCHEMA_VERSION};

/// One edge of the pipeline graph. Kafka topic names are these with a configurable prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Topic {
    Questions,
    Passages,
    Evidence,
    Facts,
    Verified,
    Missing,
    Queries,
    Answers,
    DeadLetters,
    /// Sub-questions to solve (RA-ISF).
    Nodes,
    /// Fan-out registrations and children's results, for the join stage.
    Joins,
    /// A parent with its children's results, from the join stage.
    Joined,
    /// The join stage's durable state (compacted on Kafka, read back on restart).
    JoinState,
    /// Trace steps as stages add them, best-effort, for `lacuna serve` (when `bus.progress` is on).
    Progress,
}

impl Topic {
    pub const ALL: [Topic; 14] = [
        Topic::Questions,
        Topic::Passages,
        Topic::Evidence,
        Topic::Facts,
        Topic::Verified,
        Topic::Missing,
        Topic::Queries,
        Topic::Answers,
        Topic::DeadLetters,
        Topic::Nodes,
        Topic::Joins,
        Topic::Joined,
        Topic::JoinState,
        Topic::Progress,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Topic::Questions => "questions",
            Topic::Passages => "passages",
            Topic::Evidence => "evidence",
            Topic::Facts => "facts",
            Topic::Verified => "verified",
            Topic::Missing => "missing",
            Topic::Queries => "queries",
            Topic::Answers => "answers",
            Topic::DeadLetters => "dead_letters",
            Topic::Nodes => "nodes",
            Topic::Joins => "joins",
            Topic::Joined => "joined",
            Topic::JoinState => "join_state",
            Topic::Progress => "progress",
        }
    }

    /// A table rather than a stream: the latest record per key is what counts, an empty payload
    /// deletes it, and it is read whole rather than consumed (Kafka: a compacted topic).
    pub fn is_table(self) -> bool {
        self == Topic::JoinState
    }
}

/// A typed event that belongs to one topic.
pub trait Event: Serialize + DeserializeOwned + Send + 'static {
    const TOPIC: Topic;

    /// The partitioning key: always the question id, so one question's events stay in order.
    fn key(&self) -> &str;

    fn schema_version(&self) -> u32;

    /// Serialises into a record for the bus.
    fn to_record(&self) -> Record {
        Record::new(Self::TOPIC, self.key(), serde_json::to_vec(self).expect("events serialise to JSON"))
    }

    /// Parses a record's payload: this build's schema version or the one before (see
    /// `topics/schema.rs`), refusing others rather than misreading them.
    fn from_payload(payload: &[u8]) -> Result<Self, DecodeError> {
        let event: Self = serde_json::from_slice(payload).map_err(|e| DecodeError::Json(e.to_string()))?;
        if !(OLDEST_READABLE_SCHEMA_VERSION..=SCHEMA_VERSION).contains(&event.schema_version()) {
            return Err(DecodeError::SchemaVersion(event.schema_version()));
        }
        Ok(event)
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum DecodeError {
    #[error("malformed event: {0}")]
    Json(String),
    #[error("unsupported schema_version {0} (this build reads {OLDEST_READABLE_SCHEMA_VERSION} to {SCHEMA_VERSION})")]
    SchemaVersion(u32),
}

/// Implements [`Event`] for a struct with `schema_version` and `memory` fields.
macro_rules! memory_event {
    ($ty:ty, $topic:expr) => {
        impl $crate::topics::Event for $ty {
            const TOPIC: $crate::topics::Topic = $topic;
            fn key(&self) -> &str {
                &self.memory.question_id
            }
            fn schema_version(&self) -> u32 {
                self.schema_version
            }
        }
    };
}
pub(crate) use memory_event;
