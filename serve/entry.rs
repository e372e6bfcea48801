//! One question as `lacuna serve` holds it (`registry`'s entries): its numbered stream of events,
//! the steps seen per node, and its record once done.

use std::collections::HashMap;

use serde_json::{Value, json};
use tokio::sync::watch;

use super::bodies::{QuestionStatus, Summary};
use crate::topics::TraceStep;

/// One event of a question's stream: its SSE `event:` name and its `data:` JSON.
#[derive(Clone, Debug)]
pub struct StreamEvent {
    pub name: String,
    pub data: Value,
}

pub(super) struct Entry {
    pub(super) question: String,
    pub(super) pipeline: String,
    /// Accepted by this process (counts against its open bound); false for questions another
    /// replica accepted, known here from the answers and progress topics.
    pub(super) local: bool,
    pub(super) key: Option<String>,
    /// Admitted here and not yet taken by the bus: a retry of it must not be told it was sent.
    pub(super) publishing: bool,
    pub(super) events: Vec<StreamEvent>,
    /// Steps seen per node ("root", "1.2"), so overlapping progress adds nothing twice.
    pub(super) node_steps: HashMap<String, usize>,
    /// The latest iteration seen per node, to announce each new one.
    pub(super) node_iteration: HashMap<String, u32>,
    pub(super) last_stage: String,
    pub(super) record: Option<Value>,
    pub(super) changed: watch::Sender<usize>,
    /// The JSON bytes of its events and record: what it holds, near enough.
    pub(super) bytes: usize,
}

impl Entry {
    pub(super) fn new(question: String, pipeline: String, local: bool, key: Option<String>) -> Self {
        Entry {
            question,
            pipeline,
            local,
            key,
            publishing: false,
            events: Vec::new(),
            node_steps: HashMap::new(),
            node_iteration: HashMap::new(),
            last_stage: String::new(),
            record: None,
            changed: watch::channel(0).0,
            bytes: 0,
        }
    }

    pub(super) fn push(&mut self, name: &str, data: Value) {
        self.bytes += name.len() + json_size(&data);
        self.events.push(StreamEvent { name: name.to_string(), data });
        self.changed.send_replace(self.events.len());
    }

    /// Adds the steps of `node` from index `from` that are new here.
    pub(super) fn add_steps(&mut self, node: &str, from: usize, steps: &[TraceStep]) {
        let seen = self.node_steps.get(node).copied().unwrap_or(0);
        if from > seen {
            // A gap (a dropped progress record): take what came, the record fills the trace later.
            tracing::debug!(node, from, seen, "progress skipped steps");
        }
        let skip = seen.saturating_sub(from);
        let mut index = from + skip;
        for step in steps.iter().skip(skip) {
            index += 1;
            self.node_steps.insert(node.to_string(), index);
            // A joined parent's trace repeats its children's steps as `stage@1.2`: those were shown
            // under their own node already.
            if node == "root"
                && let Some((_, path)) = step.stage.split_once('@')
                && self.node_steps.contains_key(path)
            {
                continue;
            }
            let latest = self.node_iteration.entry(node.to_string()).or_insert(0);
            if step.iteration > *latest {
                *latest = step.iteration;
                let data = json!({"node": node, "iteration": step.iteration});
                self.push("iteration", data);
            }
            self.last_stage = step.stage.clone();
            let kind = serde_json::to_value(step).ok().and_then(|v| v["kind"].as_str().map(str::to_string));
            let data = json!({"node": node, "step": step});
            self.push(&kind.unwrap_or_else(|| "step".to_string()), data);
        }
    }

    pub(super) fn status(&self) -> QuestionStatus {
        match &self.record {
            Some(record) if record["status"] == "error" => QuestionStatus::Error,
            Some(_) => QuestionStatus::Answered,
            None if self.node_steps.is_empty() => QuestionStatus::Queued,
            None => QuestionStatus::Running,
        }
    }

    pub(super) fn summary(&self, id: &str) -> Summary {
        Summary {
            id: id.to_string(),
            question: self.question.clone(),
            pipeline: self.pipeline.clone(),
            status: self.status(),
            stage: self.last_stage.clone(),
            answer: self.record.as_ref().and_then(|r| r["answer"].as_str()).map(str::to_string),
            events: self.events.len(),
        }
    }
}

/// The size of `value` as JSON.
pub(super) fn json_size(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(0, |bytes| bytes.len())
}
