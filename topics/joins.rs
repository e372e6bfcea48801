//! `joins` and `joined`: fan-out and join. A stage that splits a node into children first publishes an
//! [`JoinEvent::Expect`] naming them, then the children themselves; every finished child publishes a
//! [`JoinEvent::Result`]. Both are keyed by the root question id, so the Expect is always ahead of its
//! children's results in the same partition. The join stage answers with a [`JoinedEvent`] once every
//! child is back, or at the deadline with those that are.
//!
//! `join_state` is the join's durable state: a compacted topic holding each Expect and Result under its
//! own key until the join is done with them (then a tombstone), read back when the join restarts.

use serde::{Deserialize, Serialize};

use super::{Event, Memory, NodeResult, Record, SCHEMA_VERSION, Topic, memory_event};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JoinEvent {
    Expect {
        schema_version: u32,
        /// The parent as it was when it split: what the pipeline continues from once the children
        /// are back. `memory.node` says where it sits.
        parent: Memory,
        /// The children's node keys.
        children: Vec<String>,
        /// Unix milliseconds after which the parent goes on with whatever children returned.
        deadline_at_ms: u64,
    },
    Result {
        schema_version: u32,
        /// The parent's node key.
        parent_key: String,
        result: NodeResult,
    },
}

impl JoinEvent {
    pub fn expect(parent: Memory, children: Vec<String>, deadline_at_ms: u64) -> Self {
        JoinEvent::Expect { schema_version: SCHEMA_VERSION, parent, children, deadline_at_ms }
    }

    pub fn result(parent_key: String, result: NodeResult) -> Self {
        JoinEvent::Result { schema_version: SCHEMA_VERSION, parent_key, result }
    }

    pub fn root_id(&self) -> &str {
        match self {
            JoinEvent::Expect { parent, .. } => parent.node.as_ref().map_or(&parent.question_id, |n| &n.root_id),
            JoinEvent::Result { result, .. } => &result.node.root_id,
        }
    }

    /// The node key of the parent this event belongs to.
    pub fn parent_key(&self) -> &str {
        match self {
            JoinEvent::Expect { parent, .. } => &parent.question_id,
            JoinEvent::Result { parent_key, .. } => parent_key,
        }
    }

    /// Its key in `join_state`: one entry per Expect and per child result.
    pub fn state_key(&self) -> String {
        match self {
            JoinEvent::Expect { .. } => format!("{}\u{1f}expect", self.parent_key()),
            JoinEvent::Result { result, .. } => format!("{}\u{1f}{}", self.parent_key(), result.node.key()),
        }
    }

    /// The same event as a `join_state` entry.
    pub fn to_state_record(&self) -> Record {
        Record::new(Topic::JoinState, self.state_key(), serde_json::to_vec(self).expect("events serialise to JSON"))
    }
}

/// A `join_state` tombstone: the entry under `key` is done with.
pub fn state_tombstone(key: String) -> Record {
    Record::new(Topic::JoinState, key, Vec::new())
}

impl Event for JoinEvent {
    const TOPIC: Topic = Topic::Joins;
    fn key(&self) -> &str {
        self.root_id()
    }
    fn schema_version(&self) -> u32 {
        match self {
            JoinEvent::Expect { schema_version, .. } | JoinEvent::Result { schema_version, .. } => *schema_version,
        }
    }
}

/// A parent with its children's results: the pipeline's next step for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinedEvent {
    pub schema_version: u32,
    /// The parent, its usage, cited passages and trace already including its children's.
    pub memory: Memory,
    /// In child order.
    pub results: Vec<NodeResult>,
    /// Children that had not returned by the deadline.
    pub missing: Vec<String>,
}

memory_event!(JoinedEvent, Topic::Joined);
