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
use std::time::Duration;

use async_trait::async_trait;

use crate::actors::fanout::now_ms;
use crate::actors::stage::{Stage, StageError, decode};
use crate::metrics::METRICS;
use crate::topics::joins::state_tombstone;
use crate::topics::{
    Bus, BusError, Event, JoinEvent, JoinedEvent, Memory, NodeResult, Record, SCHEMA_VERSION, Topic, TraceKind,
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
    /// A join that looks for parents past their deadline every `tick`. It reads the state it kept
    /// back from `join_state` when it opens (see [`Stage::open`]).
    pub fn new(tick: Duration) -> Join {
        Join { pending: RefCell::default(), tick }
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

#[async_trait(?Send)]
impl Stage for Join {
    const NAME: &'static str = "join";

    /// Reads back the state kept in `join_state`: a restarted join carries on where it stopped.
    async fn open(&self, bus: &dyn Bus) -> Result<(), BusError> {
        let records = bus.read_table(Topic::JoinState).await?;
        let restored = records.len();
        for record in records {
            match JoinEvent::from_payload(&record.payload) {
                Ok(event) => self.apply(event),
                Err(error) => tracing::warn!(key = %record.key, %error, "unreadable join_state entry skipped"),
            }
        }
        if restored > 0 {
            tracing::info!(entries = restored, parents = self.pending.borrow().len(), "join state restored");
        }
        self.report();
        Ok(())
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
