//! join: where fanned-out nodes come back together. It collects the children's results of every
//! parent that split (RA-ISF sub-questions, RQ-RAG trajectories) and, once all are back, hands the
//! parent and its results to the pipeline's next stage. A parent whose children do not all return by
//! its deadline goes on with those that did, so no root question waits forever.
//!
//! State: every Expect and Result the join takes is also written to the compacted `join_state`
//! topic before the input is acknowledged, and deleted (tombstoned) once the parent went on. A
//! restarted join reads `join_state` back and carries on where it stopped. Run one join replica per
//! pipeline: the state is read whole, not per partition.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use crate::actors::main::{FinalAnswer, given_answer};
use crate::actors::stage::{Stage, StageError, decode};
use crate::metrics::METRICS;
use crate::topics::joins::state_tombstone;
use crate::topics::{
    AnswerRecord, Bus, BusError, Candidate, ErrorRecord, Event, JoinEvent, JoinedEvent, Memory, NodeRef, NodeResult,
    Outcome, Record, SCHEMA_VERSION, Topic, TraceKind, VersionedAnswer,
};

pub struct Join {
    /// By parent node key.
    pending: RefCell<BTreeMap<String, Pending>>,
    tick: Duration,
}

#[derive(Default)]
struct Pending {
    /// The parent, its children and deadline; `None` only while results precede it in a replay.
    expect: Option<(Memory, Vec<String>, u64)>,
    results: BTreeMap<String, NodeResult>,
}

impl Pending {
    fn is_complete(&self) -> bool {
        self.expect.as_ref().is_some_and(|(_, children, _)| children.iter().all(|c| self.results.contains_key(c)))
    }
}

impl Join {
    /// A join with the state `bus` kept in `join_state`.
    pub async fn restore(bus: &dyn Bus, tick: Duration) -> Result<Join, BusError> {
        let join = Join { pending: RefCell::default(), tick };
        let records = bus.read_table(Topic::JoinState).await?;
        let restored = records.len();
        for record in records {
            match JoinEvent::from_payload(&record.payload) {
                Ok(event) => join.apply(event),
                Err(error) => tracing::warn!(key = %record.key, %error, "unreadable join_state entry skipped"),
            }
        }
        if restored > 0 {
            tracing::info!(entries = restored, parents = join.pending.borrow().len(), "join state restored");
        }
        join.report();
        Ok(join)
    }

    fn apply(&self, event: JoinEvent) {
        let mut pending = self.pending.borrow_mut();
        match event {
            JoinEvent::Expect { parent, children, deadline_at_ms, .. } => {
                let key = parent.question_id.clone();
                pending.entry(key).or_default().expect = Some((parent, children, deadline_at_ms));
            }
            JoinEvent::Result { parent_key, result, .. } => {
                pending.entry(parent_key).or_default().results.insert(result.node.key(), result);
            }
        }
    }

    fn report(&self) {
        METRICS.join_pending.with_label_values::<&str>(&[]).set(self.pending.borrow().len() as i64);
    }

    /// Sends `parent_key` on with the results it has, and forgets it (and, when it gave up waiting,
    /// everything still pending below it: its own answer no longer waits for them).
    fn finish(&self, parent_key: &str) -> Vec<Record> {
        let mut pending = self.pending.borrow_mut();
        let Some(Pending { expect: Some((mut memory, children, _)), mut results }) = pending.remove(parent_key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut done_keys = vec![format!("{parent_key}\u{1f}expect")];
        let (mut returned, mut missing, mut ordered) = (Vec::new(), Vec::new(), Vec::new());
        for child in &children {
            done_keys.push(format!("{parent_key}\u{1f}{child}"));
            match results.remove(child) {
                Some(result) => {
                    merge_child(&mut memory, &result);
                    returned.push(child.clone());
                    ordered.push(result);
                }
                None => missing.push(child.clone()),
            }
        }
        if !missing.is_empty() {
            METRICS.join_deadlines.with_label_values::<&str>(&[]).inc();
            let node = memory.node_ref();
            let below: Vec<String> = pending
                .iter()
                .filter(|(_, p)| p.expect.as_ref().is_some_and(|(m, _, _)| m.node_ref().is_within(&node)))
                .map(|(key, _)| key.clone())
                .collect();
            for key in below {
                let dropped = pending.remove(&key).expect("listed above");
                done_keys.push(format!("{key}\u{1f}expect"));
                done_keys.extend(dropped.results.keys().map(|child| format!("{key}\u{1f}{child}")));
            }
        }
        let answers =
            ordered.iter().flat_map(|r| r.candidates.iter().map(|c| (c.node.key(), c.answer.clone()))).collect();
        memory.record(Self::NAME, TraceKind::Joined { returned, missing: missing.clone(), answers });
        out.push(JoinedEvent { schema_version: SCHEMA_VERSION, memory, results: ordered, missing }.to_record());
        out.extend(done_keys.into_iter().map(state_tombstone));
        drop(pending);
        self.report();
        out
    }
}

/// Adds a child's spending, citations and trace to its parent's. Trace steps name the child they
/// come from, so the root's trace reads as one tree.
fn merge_child(memory: &mut Memory, result: &NodeResult) {
    memory.usage.add(&result.usage);
    memory.cited_passages.extend(result.cited_passages.clone());
    let at = result.node.path_text();
    for step in &result.trace {
        let mut step = step.clone();
        if !step.stage.contains('@') {
            step.stage = format!("{}@{at}", step.stage);
        }
        memory.trace.push(step);
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[async_trait(?Send)]
impl Stage for Join {
    const NAME: &'static str = "join";

    fn inputs(&self) -> &'static [Topic] {
        &[Topic::Joins]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let event: JoinEvent = decode(record)?;
        let parent_key = event.parent_key().to_string();
        // Expects always precede their children's results: a result without one is late.
        if matches!(event, JoinEvent::Result { .. }) && !self.pending.borrow().contains_key(&parent_key) {
            METRICS.join_late_results.with_label_values::<&str>(&[]).inc();
            tracing::warn!(parent = %parent_key, "result after its parent went on: dropped");
            return Ok(Vec::new());
        }
        let mut out = vec![event.to_state_record()];
        self.apply(event);
        self.report();
        if self.pending.borrow().get(&parent_key).is_some_and(Pending::is_complete) {
            out.extend(self.finish(&parent_key));
        }
        Ok(out)
    }

    fn tick_every(&self) -> Option<Duration> {
        Some(self.tick)
    }

    /// Parents past their deadline go on with what they have (outermost first: a root that gives up
    /// drops what waits below it), and parents a restart found complete go on too.
    async fn tick(&self) -> Vec<Record> {
        let now = now_ms();
        let mut due: Vec<(u32, String)> = self
            .pending
            .borrow()
            .iter()
            .filter(|(_, p)| p.is_complete() || p.expect.as_ref().is_some_and(|(_, _, deadline)| *deadline <= now))
            .map(|(key, p)| (p.expect.as_ref().map_or(0, |(m, _, _)| m.node_ref().depth()), key.clone()))
            .collect();
        due.sort();
        due.into_iter().flat_map(|(_, key)| self.finish(&key)).collect()
    }
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

/// The error record of a root question none of whose children returned by the deadline.
pub fn deadline_error(memory: Memory, stage: &str, missing: &[String]) -> Record {
    METRICS.answers.with_label_values(&["error"]).inc();
    let record = ErrorRecord {
        question_id: memory.question_id,
        question: memory.question,
        stage: stage.to_string(),
        error_type: "deadline_exceeded".to_string(),
        message: format!(
            "no sub-question or trajectory returned by the join deadline (waiting for {})",
            missing.join(", ")
        ),
        trace: memory.trace,
    };
    VersionedAnswer::from(AnswerRecord::Error(record)).to_record()
}

/// True for the node the user asked about.
pub fn is_root(memory: &Memory) -> bool {
    memory.node.as_ref().is_none_or(NodeRef::is_root)
}

/// Ends a node with an answer: a root's goes to the answers topic, a child's back to its parent.
pub(crate) fn answer_node(memory: Memory, stage: &str, answer: FinalAnswer, outcome: Outcome) -> Record {
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
