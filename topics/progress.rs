//! `progress`: the trace steps a stage just added, for whoever watches questions think (`lacuna
//! serve`). Best-effort by design: a stage publishes them after its real outputs went out, a failed
//! or slow publish is counted and forgotten, and nothing downstream depends on them. The answer
//! record still carries the whole trace.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Event, Record, Topic, TraceStep};

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

/// One node's trace as an event shows it: which question and node, and its steps.
struct NodeTrace {
    root_id: String,
    node_key: String,
    path: String,
    trace: Vec<Value>,
}

/// Reads the node and trace an event payload carries: an event with memory, a finished child on
/// its way to the join, or an answer record.
fn node_trace(payload: &[u8]) -> Option<NodeTrace> {
    let value: Value = serde_json::from_slice(payload).ok()?;
    let (holder, node) = if let Some(memory) = value.get("memory") {
        (memory, memory.get("node"))
    } else if let Some(result) = value.get("result") {
        (result, result.get("node"))
    } else if let Some(parent) = value.get("parent") {
        (parent, parent.get("node"))
    } else {
        (&value, None)
    };
    let own_id = holder.get("question_id").and_then(Value::as_str);
    let (root_id, path): (String, Vec<u64>) = match node.filter(|n| !n.is_null()) {
        Some(node) => (
            node["root_id"].as_str()?.to_string(),
            node["path"].as_array()?.iter().filter_map(Value::as_u64).collect(),
        ),
        None => (own_id.or(value.get("id").and_then(Value::as_str))?.to_string(), Vec::new()),
    };
    let path = if path.is_empty() {
        "root".to_string()
    } else {
        path.iter().map(u64::to_string).collect::<Vec<_>>().join(".")
    };
    let node_key = if path == "root" { root_id.clone() } else { format!("{root_id}#{path}") };
    let trace = holder.get("trace").and_then(Value::as_array).cloned().unwrap_or_default();
    Some(NodeTrace { root_id, node_key, path, trace })
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
                Some(before) if before.node_key == after.node_key => before.trace.len(),
                _ => 0,
            };
            let steps: Vec<TraceStep> =
                after.trace.iter().skip(from).filter_map(|s| serde_json::from_value(s.clone()).ok()).collect();
            (!steps.is_empty()).then(|| {
                ProgressEvent {
                    schema_version: super::SCHEMA_VERSION,
                    question_id: after.root_id,
                    node: after.path,
                    stage: stage.to_string(),
                    from,
                    steps,
                }
                .to_record()
            })
        })
        .collect()
}
