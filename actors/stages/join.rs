//! join: where fanned-out nodes come back together. It collects the children's results of every
//! parent that split (RA-ISF sub-questions, RQ-RAG trajectories) and, once all are back, hands the
//! parent and its results to the pipeline's next stage. A parent whose children do not all return by
//! its deadline goes on with those that did, so no root question waits forever.
//!
//! State: every Expect and Result the join takes is also written to the compacted `join_state`
//! topic before the input is acknowledged, and deleted (tombstoned) once the parent's `joined`
//! record was acknowledged by the bus; a failed publish changes nothing, so a retry finds it all. A
//! restarted join reads `join_state` back and carries on where it stopped. Run one join replica per
//! pipeline: the state is read whole, not per partition.

use std::cell::{OnceCell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::actors::prompts::NamedPrompt;
use crate::actors::runner::{Stage, StageError, decode, failure_records, publish_progress};
use crate::actors::shared::fanout::now_ms;
use crate::config::Settings;
use crate::metrics::METRICS;
use crate::topics::joins::state_tombstone;
use crate::topics::{
    Bus, BusError, Event, JoinEvent, JoinedEvent, Memory, NodeResult, Record, SCHEMA_VERSION, Topic, TraceKind,
};

pub struct Join {
    /// By parent node key.
    pending: RefCell<BTreeMap<String, Pending>>,
    /// Parents whose `joined` record is being published: events and ticks interleave at awaits,
    /// and a parent goes on once.
    sending: RefCell<BTreeSet<String>>,
    /// State deletions of parents that went on, not yet written.
    unwritten: RefCell<VecDeque<Record>>,
    /// The join publishes for itself: a parent's state goes only after its `joined` record is out.
    bus: OnceCell<Arc<dyn Bus>>,
    /// `bus.max_event_bytes`: the join publishes past the runner, so it keeps the limit itself.
    max_event_bytes: usize,
    tick: Duration,
    /// `bus.progress`: the joined parent's new steps (its children's, the join) go to `progress`.
    progress: Option<Duration>,
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
    pub fn new(tick: Duration, max_event_bytes: usize, progress: Option<Duration>) -> Join {
        Join {
            pending: RefCell::default(),
            sending: RefCell::default(),
            unwritten: RefCell::default(),
            bus: OnceCell::new(),
            max_event_bytes,
            tick,
            progress,
        }
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

    /// What sending `parent_key` on would publish and forget, computed without changing anything:
    /// the state goes only once the `joined` record is acknowledged.
    fn plan(&self, parent_key: &str) -> Option<Plan> {
        let pending = self.pending.borrow();
        let parent = pending.get(parent_key)?;
        let (mut memory, children, _) = parent.expect.clone()?;
        let split_steps = memory.trace.len();
        let mut gone = vec![parent_key.to_string()];
        let mut done_keys = vec![format!("{parent_key}\u{1f}expect")];
        let (mut returned, mut missing, mut ordered) = (Vec::new(), Vec::new(), Vec::new());
        for child in &children {
            done_keys.push(format!("{parent_key}\u{1f}{child}"));
            match parent.results.get(child) {
                Some(result) => {
                    merge_child(&mut memory, result);
                    returned.push(child.clone());
                    ordered.push(result.clone());
                }
                None => missing.push(child.clone()),
            }
        }
        if !missing.is_empty() {
            // A parent that gave up waiting drops everything still pending below it: its own answer
            // no longer waits for them.
            let node = memory.node_ref();
            for (key, below) in pending.iter() {
                if key != parent_key && below.expect.as_ref().is_some_and(|(m, _, _)| m.node_ref().is_within(&node)) {
                    gone.push(key.clone());
                    done_keys.push(format!("{key}\u{1f}expect"));
                    done_keys.extend(below.results.keys().map(|child| format!("{key}\u{1f}{child}")));
                }
            }
        }
        let answers =
            ordered.iter().flat_map(|r| r.candidates.iter().map(|c| (c.node.key(), c.answer.clone()))).collect();
        memory.record(Self::NAME, TraceKind::Joined { returned, missing: missing.clone(), answers });
        let gave_up = !missing.is_empty();
        let progress = crate::topics::progress::memory_progress(Self::NAME, &memory, split_steps);
        let joined = JoinedEvent { schema_version: SCHEMA_VERSION, memory, results: ordered, missing }.to_record();
        let tombstones = done_keys.into_iter().map(state_tombstone).collect();
        Some(Plan { joined, progress, gone, tombstones, gave_up })
    }

    /// Sends `parent_key` on with the results it has: publishes `joined` and, once the bus has
    /// acknowledged it, forgets the parent and deletes its state. A failed publish leaves
    /// everything as it was, for the event's retry or the next tick.
    async fn go_on(&self, parent_key: &str) -> Result<(), BusError> {
        if !self.sending.borrow_mut().insert(parent_key.to_string()) {
            return Ok(());
        }
        let Some(plan) = self.plan(parent_key) else {
            self.sending.borrow_mut().remove(parent_key);
            return Ok(());
        };
        // Like the runner's progress, before the output it describes, and never in its way.
        if let (Some(timeout), Some(progress)) = (self.progress, plan.progress.clone()) {
            publish_progress(Self::NAME, &**self.bus(), self.max_event_bytes, vec![progress], timeout).await;
        }
        // A parent carries its children's traces: trimmed like any event the runner publishes.
        let published = match crate::topics::size::fit(plan.joined.clone(), self.max_event_bytes) {
            Ok(joined) => self.bus().publish(joined).await,
            Err(reason) => Err(BusError::Rejected(reason)),
        };
        let published = match published {
            // No retry or tick would make the bus take it: the parent ends here instead.
            Err(BusError::Rejected(reason)) => self.end_in_error(&plan.joined, reason).await,
            other => other,
        };
        self.sending.borrow_mut().remove(parent_key);
        published?;
        {
            let mut pending = self.pending.borrow_mut();
            for key in &plan.gone {
                pending.remove(key);
            }
        }
        if plan.gave_up {
            METRICS.join_deadlines.with_label_values::<&str>(&[]).inc();
        }
        self.report();
        self.unwritten.borrow_mut().extend(plan.tombstones);
        self.write_tombstones().await
    }

    /// Ends a parent whose `joined` record the bus will never take (too large even trimmed, refused
    /// for good) as the runner ends a question whose output is rejected: an error record for a root,
    /// a failed result for a child's own parent, and the record as a dead letter. The parent is then
    /// forgotten like one that went on, so it neither fails again on every tick nor holds back the
    /// parents due after it.
    async fn end_in_error(&self, joined: &Record, reason: String) -> Result<(), BusError> {
        let error = StageError::Bus(BusError::Rejected(reason));
        tracing::error!(key = %joined.key, %error, "a joined parent cannot be published: ending it");
        for record in failure_records(Self::NAME, joined, &error, 1) {
            let record = crate::topics::size::fit(record, self.max_event_bytes).map_err(BusError::Rejected)?;
            self.bus().publish(record).await?;
        }
        METRICS.events_failed.with_label_values(&[Self::NAME, error.error_type()]).inc();
        METRICS.dead_letters.with_label_values(&[Self::NAME]).inc();
        Ok(())
    }

    /// Deletes the state of parents that went on. A deletion that fails waits for the next tick: until
    /// it is written, a restart would restore the parent and send it on a second time (the answers'
    /// sink keeps one record per question).
    async fn write_tombstones(&self) -> Result<(), BusError> {
        loop {
            let Some(tombstone) = self.unwritten.borrow_mut().pop_front() else { return Ok(()) };
            if let Err(error) = self.bus().publish(tombstone.clone()).await {
                self.unwritten.borrow_mut().push_front(tombstone);
                return Err(error);
            }
        }
    }

    fn bus(&self) -> &Arc<dyn Bus> {
        self.bus.get().expect("the runner opens a stage before it takes events")
    }
}

/// What sending a parent on publishes and forgets.
struct Plan {
    joined: Record,
    /// The parent's steps since it split (its children's and the join's), for `progress`.
    progress: Option<Record>,
    /// Parent keys whose pending state goes: the parent, and what waited below it if it gave up.
    gone: Vec<String>,
    tombstones: Vec<Record>,
    gave_up: bool,
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
    const PUBLISHES_ITSELF: bool = true;

    /// The join asks no LLM.
    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        Vec::new()
    }

    /// Reads back the state kept in `join_state`: a restarted join carries on where it stopped.
    async fn open(&self, bus: &Arc<dyn Bus>) -> Result<(), BusError> {
        let _ = self.bus.set(bus.clone());
        // Its pending parents live in memory: an aborted transaction cannot take them back.
        bus.keeps_state(Self::NAME);
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
        // The event is kept before it counts: a restart reads it back.
        self.bus().publish(event.to_state_record()).await?;
        self.apply(event);
        self.report();
        if self.pending.borrow().get(&parent_key).is_some_and(Pending::is_complete) {
            self.go_on(&parent_key).await?;
        }
        Ok(Vec::new())
    }

    fn tick_every(&self) -> Option<Duration> {
        Some(self.tick)
    }

    /// Parents past their deadline go on with what they have (outermost first: a root that gives up
    /// drops what waits below it), and parents a restart found complete go on too.
    async fn tick(&self) {
        if let Err(error) = self.write_tombstones().await {
            tracing::warn!(%error, "cannot delete join state yet; the next tick tries again");
        }
        let now = now_ms();
        let mut due: Vec<(u32, String)> = self
            .pending
            .borrow()
            .iter()
            .filter(|(_, p)| p.is_complete() || p.expect.as_ref().is_some_and(|(_, _, deadline)| *deadline <= now))
            .map(|(key, p)| (p.expect.as_ref().map_or(0, |(m, _, _)| m.node_ref().depth()), key.clone()))
            .collect();
        due.sort();
        for (_, key) in due {
            match self.go_on(&key).await {
                Ok(()) => {}
                // Not even its error record fits: this parent alone is stuck, the others go on.
                Err(error @ BusError::Rejected(_)) => {
                    tracing::error!(parent = %key, %error, "cannot end a joined parent; the next tick tries again");
                }
                // The bus is unavailable: what is left stays pending, whole, for the next tick.
                Err(error) => {
                    tracing::error!(parent = %key, %error, "cannot send a joined parent on; the next tick tries again");
                    break;
                }
            }
        }
    }
}
