//! Fan-out: how a node that splits (RA-ISF sub-questions, RQ-RAG trajectories) registers its children
//! with the join, how a finished child goes back to its parent, and how a node is told apart from
//! the root question the user asked.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::actors::shared::answer::{FinalAnswer, given_answer};
use crate::topics::{Candidate, Event, JoinEvent, Memory, NodeRef, NodeResult, Outcome, Record};

/// Milliseconds since the epoch: deadlines travel in events, so they are wall-clock times.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The Expect to publish before a parent's children: the join then waits for all of them, or until
/// `deadline` from now.
pub fn expect_record(parent: &Memory, children: &[Memory], deadline: Duration) -> Record {
    let keys = children.iter().map(|c| c.question_id.clone()).collect();
    JoinEvent::expect(parent.clone(), keys, now_ms() + deadline.as_millis() as u64).to_record()
}

/// A finished child node, on its way to its parent through the join.
pub fn result_record(memory: Memory, candidates: Vec<Candidate>) -> Record {
    let node = memory.node_ref();
    let parent = node.parent().map(|p| p.key()).unwrap_or_default();
    let result = NodeResult {
        node,
        question: memory.question,
        candidates,
        usage: memory.usage,
        cited_passages: memory.cited_passages,
        trace: memory.trace,
    };
    JoinEvent::result(parent, result).to_record()
}

/// True for the node the user asked about.
pub fn is_root(memory: &Memory) -> bool {
    memory.node.as_ref().is_none_or(NodeRef::is_root)
}

/// The memory of an event that belongs to a child node, if it is one (read leniently: the event
/// may not decode as its type).
pub fn child_memory(payload: &[u8]) -> Option<Memory> {
    let value = serde_json::from_slice::<serde_json::Value>(payload).ok()?;
    let memory: Memory = serde_json::from_value(value.get("memory")?.clone()).ok()?;
    (!is_root(&memory)).then_some(memory)
}

/// Ends a node with an answer: a root's goes to the answers topic, a child's back to its parent.
pub fn answer_node(memory: Memory, stage: &str, answer: FinalAnswer, outcome: Outcome) -> Record {
    if is_root(&memory) {
        return given_answer(memory, stage, answer, outcome);
    }
    let candidate = Candidate {
        answer: answer.answer.trim().to_string(),
        confidence: answer.confidence,
        explanation: answer.explanation,
        node: memory.node_ref(),
        queries: Vec::new(),
        logprobs: None,
        trajectory_logprobs: None,
        citations: memory.cited_passages.keys().cloned().collect(),
    };
    result_record(memory, vec![candidate])
}
