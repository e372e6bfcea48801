//! `progress`: the trace steps a stage just added, for whoever watches questions think (`lacuna
//! serve`). A stage publishes them just before its real outputs, so a question's steps reach the
//! topic in the order they happened. Best-effort by design: a failed or slow publish is counted and
//! forgotten, and nothing downstream depends on them. The answer record still carries the whole trace.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Event, Memory, NodeRef, Record, Topic, TraceStep};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgressEvent {
    pub schema_version: u32,
    /// The question the user asked (the root of a fanned-out tree).
    pub question_id: String,
    /// Where in the tree the steps happened: "root", or a sub-question's path such as "1.2".
    pub node: String,
    pub stage: String,
    /// The index of the first step in the node's own trace: a reader that already has steps up to
    /// there keeps only what is new, so a repeated or overlapping event adds nothing twice.
    pub from: usize,
    pub steps: Vec<TraceStep>,
}

impl Event for ProgressEvent {
    const TOPIC: Topic = Topic::Progress;
    fn key(&self) -> &str {
        &self.question_id
    }
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

/// One node's trace as an event shows it.
struct NodeTrace {
    node: NodeRef,
    trace: Vec<Value>,
}

/// Reads the node and trace an event payload carries: an event with memory, a finished child on
/// its way to the join, a parent waiting for its children, or an answer record (a question has no
/// trace yet).
fn node_trace(payload: &[u8]) -> Option<NodeTrace> {
    let mut value: Value = serde_json::from_slice(payload).ok()?;
    let question_event_id = value.get("id").and_then(Value::as_str).map(str::to_string);
    let holder = match ["memory", "result", "parent"].into_iter().find(|k| value.get(k).is_some()) {
        Some(key) => value.get_mut(key)?,
        None => &mut value,
    };
    let node = match holder.get("node").and_then(|n| NodeRef::deserialize(n).ok()) {
        Some(node) => node,
        None => {
            NodeRef::root(holder.get("question_id").and_then(Value::as_str).map(str::to_string).or(question_event_id)?)
        }
    };
    // Taken, not cloned: traces grow with every iteration and this runs on every event.
    let trace = match holder.get_mut("trace").map(Value::take) {
        Some(Value::Array(steps)) => steps,
        _ => Vec::new(),
    };
    Some(NodeTrace { node, trace })
}

/// The progress records for one handled event: for each output, the steps its node's trace gained
/// over the input's (all of them for a node the input was not, such as a new sub-question).
pub fn progress_records(stage: &str, input: &Record, outputs: &[Record]) -> Vec<Record> {
    let before = node_trace(&input.payload);
    outputs
        .iter()
        .filter(|record| record.topic != Topic::DeadLetters)
        .filter_map(|record| node_trace(&record.payload))
        .filter_map(|after| {
            let from = match &before {
                Some(before) if before.node == after.node => before.trace.len(),
                _ => 0,
            };
            let steps: Vec<TraceStep> =
                after.trace.into_iter().skip(from).filter_map(|s| serde_json::from_value(s).ok()).collect();
            (!steps.is_empty()).then(|| {
                ProgressEvent {
                    schema_version: super::SCHEMA_VERSION,
                    node: after.node.path_text(),
                    question_id: after.node.root_id,
                    stage: stage.to_string(),
                    from,
                    steps,
                }
                .to_record()
            })
        })
        .collect()
}

/// The progress record of the steps `memory`'s trace holds from index `from` on, if any: for a stage
/// that builds a node's memory itself rather than through the runner (the join's joined parent).
pub fn memory_progress(stage: &str, memory: &Memory, from: usize) -> Option<Record> {
    let steps = memory.trace.get(from..).filter(|steps| !steps.is_empty())?.to_vec();
    let node = memory.node_ref();
    let event = ProgressEvent {
        schema_version: super::SCHEMA_VERSION,
        question_id: node.root_id.clone(),
        node: node.path_text(),
        stage: stage.to_string(),
        from,
        steps,
    };
    Some(event.to_record())
}
