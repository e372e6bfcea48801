//! What `lacuna serve` knows of each question: accepted, the stream of its trace steps as they come,
//! and its record once done. Each question's stream is a list of numbered events (the SSE ids), so a
//! client that reconnects with `Last-Event-ID` resumes where it left off.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use super::bodies::{NodeStep, Progress, Summary};
use super::entry::{Entry, StreamEvent, json_size};
use crate::metrics::METRICS;
use crate::topics::{AnswerRecord, ProgressEvent, QuestionEvent, VersionedAnswer};

/// A question's events from some index on, numbered.
pub struct Events {
    pub events: Vec<(usize, StreamEvent)>,
    /// The record is among the events: nothing follows.
    pub done: bool,
    /// Changes when events are added after these.
    pub changed: watch::Receiver<usize>,
}

/// A question a client asks for, before it is accepted.
#[derive(Clone, Debug)]
pub struct NewQuestion {
    /// The client's own id, if it gave one.
    pub id: Option<String>,
    /// An `Idempotency-Key`: the same key always means the same question.
    pub key: Option<String>,
    pub question: String,
    pub pipeline: String,
    pub yes_no: bool,
}

/// What `admit` did with one question.
#[derive(Debug)]
pub enum Admitted {
    /// New: the caller publishes it, then calls `published` (or `withdraw` if it cannot).
    New(QuestionEvent),
    /// Asked before (same id or key): nothing to publish.
    Existing(String),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AdmitError {
    #[error("{open} questions are open and this request adds {asked}; at most {max} may be (retry later)")]
    TooManyOpen { open: usize, asked: usize, max: usize },
    #[error("question id {0:?} was already asked with a different question or pipeline")]
    Conflict(String),
    #[error("question {0:?} is still being published by an earlier request: retry shortly")]
    Publishing(String),
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Idempotency-Key -> question id.
    keys: HashMap<String, String>,
    /// Finished questions, oldest first: the first forgotten.
    finished: VecDeque<String>,
    /// Accepted here and not finished.
    open: usize,
    /// Every id in arrival order (for the list the page shows).
    order: VecDeque<String>,
    /// What every entry holds, in bytes.
    bytes: usize,
    /// Ids forgotten lately, oldest first, so a late progress or record of one does not bring it
    /// back as a question that never finishes. As many as `keep_finished`.
    forgotten: HashSet<String>,
    forgotten_order: VecDeque<String>,
}

impl Inner {
    /// The entry of `id`; one this process never saw is created as another replica's question of
    /// `pipeline`, known here from the topics (its text comes with its record). None for one
    /// forgotten lately: what still comes of it is late.
    fn known(&mut self, id: &str, pipeline: &str) -> Option<&mut Entry> {
        let Inner { entries, order, forgotten, .. } = self;
        if forgotten.contains(id) {
            return None;
        }
        Some(entries.entry(id.to_string()).or_insert_with(|| {
            order.push_back(id.to_string());
            Entry::new(String::new(), pipeline.to_string(), false, None)
        }))
    }

    /// Takes `id`'s entry out, with its key, its place in the list and its bytes.
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let mut entry = self.entries.remove(id)?;
        self.bytes -= entry.bytes;
        if let Some(key) = entry.key.take() {
            self.keys.remove(&key);
        }
        self.order.retain(|o| o != id);
        Some(entry)
    }

    /// Drops `id`'s entry and remembers that it did, for `remember` ids at most.
    fn forget(&mut self, id: &str, remember: usize) {
        self.remove(id);
        if self.forgotten.insert(id.to_string()) {
            self.forgotten_order.push_back(id.to_string());
        }
        while self.forgotten_order.len() > remember {
            let Some(old) = self.forgotten_order.pop_front() else { break };
            self.forgotten.remove(&old);
        }
    }

    /// Forgets the oldest finished questions past `keep_finished` or `max_bytes`; past the bytes
    /// with none finished left, other replicas' unfinished ones, oldest first. A question accepted
    /// here and open is never forgotten: `max_open_questions` bounds those.
    fn evict(&mut self, keep_finished: usize, max_bytes: usize) {
        while self.finished.len() > keep_finished || (self.bytes > max_bytes && !self.finished.is_empty()) {
            let Some(old) = self.finished.pop_front() else { break };
            self.forget(&old, keep_finished);
        }
        while self.bytes > max_bytes {
            let remote = self.order.iter().find(|id| self.entries.get(*id).is_some_and(|e| !e.local)).cloned();
            let Some(old) = remote else { break };
            self.forget(&old, keep_finished);
        }
    }

    /// An entry grew by `bytes`: counted, and the oldest forgotten past the bounds.
    fn grew(&mut self, bytes: usize, keep_finished: usize, max_bytes: usize) {
        self.bytes += bytes;
        self.evict(keep_finished, max_bytes);
        METRICS.serve_registry_bytes.with_label_values::<&str>(&[]).set(self.bytes as i64);
    }
}

pub struct Registry {
    inner: Mutex<Inner>,
    max_open: usize,
    keep_finished: usize,
    max_bytes: usize,
}

/// A new question id: time, process and a counter, unique without coordination.
fn new_id() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let millis = crate::actors::shared::fanout::now_ms();
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("q-{millis:x}-{:x}-{count:x}", std::process::id())
}

/// The id a question asked idempotently has on every replica: the client's own, or one derived
/// from its `Idempotency-Key`. Two replicas that each take the same key before either hears of the
/// other's question publish the same id; with [`QuestionEvent::idempotent`] they publish the same
/// event, and the first stage skips the second copy (`actors/dedupe.rs`).
fn idempotent_id(asked: &NewQuestion) -> Option<String> {
    use sha2::{Digest, Sha256};
    asked.id.clone().or_else(|| {
        let key = asked.key.as_ref()?;
        let digest = Sha256::digest(key.as_bytes());
        Some(format!("k-{}", crate::topics::provenance::hex(&digest[..16])))
    })
}

impl Registry {
    pub fn new(max_open: usize, keep_finished: usize, max_bytes: usize) -> Self {
        Registry { inner: Mutex::default(), max_open, keep_finished: keep_finished.max(1), max_bytes }
    }

    pub fn open(&self) -> usize {
        self.inner.lock().unwrap().open
    }

    /// Takes a request's questions, all or none: each is new, or one asked before (by id or key).
    pub fn admit(&self, questions: Vec<NewQuestion>) -> Result<Vec<Admitted>, AdmitError> {
        let mut inner = self.inner.lock().unwrap();
        let mut admitted = Vec::new();
        let mut new = 0;
        for asked in &questions {
            let known = asked
                .key
                .as_ref()
                .and_then(|key| inner.keys.get(key).cloned())
                .or_else(|| idempotent_id(asked).filter(|id| inner.entries.contains_key(id)));
            match known {
                Some(id) => {
                    let entry = &inner.entries[&id];
                    // Another replica's question known only from progress has no text to compare.
                    let same = (entry.question.is_empty() || entry.question == asked.question)
                        && entry.pipeline == asked.pipeline;
                    if !same {
                        return Err(AdmitError::Conflict(id));
                    }
                    // Its first request may yet fail to publish it: "asked before" would be a lie.
                    if entry.publishing {
                        return Err(AdmitError::Publishing(id));
                    }
                    admitted.push(Some(id));
                }
                None => {
                    new += 1;
                    admitted.push(None);
                }
            }
        }
        // Two new questions of one batch under one id (an explicit id equal to a sibling's derived
        // one) would be one entry counted open twice, which one record never closes.
        let mut ids = HashSet::new();
        for (asked, known) in questions.iter().zip(&admitted) {
            if let (None, Some(id)) = (known, idempotent_id(asked))
                && !ids.insert(id.clone())
            {
                return Err(AdmitError::Conflict(id));
            }
        }
        if new > 0 && inner.open + new > self.max_open {
            return Err(AdmitError::TooManyOpen { open: inner.open, asked: new, max: self.max_open });
        }
        let mut out = Vec::new();
        for (asked, known) in questions.into_iter().zip(admitted) {
            if let Some(id) = known {
                out.push(Admitted::Existing(id));
                continue;
            }
            let idempotent = idempotent_id(&asked);
            let id = idempotent.clone().unwrap_or_else(new_id);
            if let Some(key) = &asked.key {
                inner.keys.insert(key.clone(), id.clone());
            }
            let mut entry = Entry::new(asked.question.clone(), asked.pipeline.clone(), true, asked.key);
            entry.publishing = true;
            entry.push("accepted", json!({"id": id, "question": asked.question, "pipeline": asked.pipeline}));
            inner.bytes += entry.bytes;
            inner.forgotten.remove(&id);
            inner.entries.insert(id.clone(), entry);
            inner.order.push_back(id.clone());
            inner.open += 1;
            let mut event = QuestionEvent::new(id, asked.question).yes_no(asked.yes_no);
            if idempotent.is_some() {
                event = event.idempotent();
            }
            out.push(Admitted::New(event));
        }
        METRICS.serve_open_questions.with_label_values::<&str>(&[]).set(inner.open as i64);
        Ok(out)
    }

    /// The bus took `id`: from now on a retry of it is the same question.
    pub fn published(&self, id: &str) {
        if let Some(entry) = self.inner.lock().unwrap().entries.get_mut(id) {
            entry.publishing = false;
        }
    }

    /// Forgets a question the bus did not take: it was never accepted.
    pub fn withdraw(&self, id: &str) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(entry) = inner.remove(id)
            && entry.local
            && entry.record.is_none()
        {
            inner.open -= 1;
        }
        METRICS.serve_open_questions.with_label_values::<&str>(&[]).set(inner.open as i64);
    }

    /// Steps a stage of `pipeline` added.
    pub fn progress(&self, pipeline: &str, event: ProgressEvent) {
        let mut inner = self.inner.lock().unwrap();
        let Some(entry) = inner.known(&event.question_id, pipeline) else { return };
        if entry.record.is_some() {
            return;
        }
        let before = entry.bytes;
        entry.add_steps(&event.node, event.from, &event.steps);
        let grown = entry.bytes - before;
        inner.grew(grown, self.keep_finished, self.max_bytes);
    }

    /// A question's record: its stream's last event. A second record for it is ignored.
    pub fn finish(&self, pipeline: &str, answer: VersionedAnswer) {
        let id = answer.record.question_id().to_string();
        let mut inner = self.inner.lock().unwrap();
        let Some(entry) = inner.known(&id, pipeline) else { return };
        if entry.record.is_some() {
            return;
        }
        let before = entry.bytes;
        let (question, trace) = match &answer.record {
            AnswerRecord::Answered(a) => (&a.question, &a.trace),
            AnswerRecord::Error(e) => (&e.question, &e.trace),
        };
        if entry.question.is_empty() {
            entry.question = question.clone();
        }
        // Steps whose progress never came (dropped, or progress off) complete the stream first.
        entry.add_steps("root", 0, trace);
        let record = serde_json::to_value(&answer).expect("records serialise");
        // Held twice: as the record and as the stream's last event.
        entry.bytes += json_size(&record);
        entry.record = Some(record.clone());
        let local = entry.local;
        entry.push("record", record);
        let grown = entry.bytes - before;
        if local {
            inner.open -= 1;
        }
        inner.finished.push_back(id);
        inner.grew(grown, self.keep_finished, self.max_bytes);
        METRICS.serve_open_questions.with_label_values::<&str>(&[]).set(inner.open as i64);
    }

    /// `GET /v1/questions/{id}`: the record when done, else the status and the steps so far.
    pub fn get(&self, id: &str) -> Option<Value> {
        let inner = self.inner.lock().unwrap();
        let entry = inner.entries.get(id)?;
        if let Some(record) = &entry.record {
            return Some(record.clone());
        }
        let steps = entry
            .events
            .iter()
            .filter_map(|e| {
                Some(NodeStep { node: e.data["node"].as_str()?.to_string(), step: e.data.get("step")?.clone() })
            })
            .collect();
        let progress = Progress {
            id: id.to_string(),
            question: entry.question.clone(),
            pipeline: entry.pipeline.clone(),
            status: entry.status(),
            stage: entry.last_stage.clone(),
            steps,
        };
        Some(serde_json::to_value(progress).expect("progress serialises"))
    }

    /// The record, if the question is done.
    pub fn record(&self, id: &str) -> Option<Value> {
        self.inner.lock().unwrap().entries.get(id).and_then(|e| e.record.clone())
    }

    /// The newest `limit` questions, newest first, and where each stands.
    pub fn list(&self, limit: usize) -> Vec<Summary> {
        let inner = self.inner.lock().unwrap();
        inner.order.iter().rev().take(limit).filter_map(|id| inner.entries.get(id).map(|e| e.summary(id))).collect()
    }

    /// Open questions by the stage of their latest step ("" for those not started).
    pub fn by_stage(&self) -> HashMap<String, usize> {
        let inner = self.inner.lock().unwrap();
        let mut counts = HashMap::new();
        for entry in inner.entries.values().filter(|e| e.record.is_none()) {
            let stage = entry.last_stage.split('@').next().unwrap_or_default().to_string();
            *counts.entry(stage).or_insert(0) += 1;
        }
        counts
    }

    /// The events of `id` from index `from`, whether the stream is complete, and a watch that
    /// changes when more come. `None` for a question this process does not know.
    pub fn events_from(&self, id: &str, from: usize) -> Option<Events> {
        let inner = self.inner.lock().unwrap();
        let entry = inner.entries.get(id)?;
        let events = entry.events.iter().enumerate().skip(from).map(|(i, e)| (i, e.clone())).collect();
        Some(Events { events, done: entry.record.is_some(), changed: entry.changed.subscribe() })
    }

    /// Waits up to `timeout` for the record of `id`.
    pub async fn wait_record(&self, id: &str, timeout: Duration) -> Option<Value> {
        let wait = async {
            loop {
                let Events { done, mut changed, .. } = self.events_from(id, usize::MAX)?;
                if done {
                    return self.record(id);
                }
                changed.changed().await.ok()?;
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topics::{Event, TraceKind, TraceStep};

    fn asked(id: &str) -> NewQuestion {
        NewQuestion {
            id: Some(id.into()),
            key: None,
            question: "Who?".into(),
            pipeline: "migres".into(),
            yes_no: false,
        }
    }

    /// Over Kafka a replica may know a question only from its progress: asking it again there
    /// returns that question, not a conflict and not a second one.
    #[test]
    fn a_question_known_from_another_replicas_progress_is_the_same_question() {
        let registry = Registry::new(4, 10, 1 << 20);
        let step = TraceStep {
            stage: "retrieve".into(),
            iteration: 1,
            kind: TraceKind::QueriesWritten { queries: vec!["Who?".into()], dropped: Vec::new() },
        };
        let event = ProgressEvent {
            schema_version: crate::topics::SCHEMA_VERSION,
            question_id: "elsewhere".into(),
            node: "root".into(),
            stage: "retrieve".into(),
            from: 0,
            steps: vec![step],
        };
        registry.progress("migres", event);
        let admitted = registry.admit(vec![asked("elsewhere")]).unwrap();
        assert!(matches!(&admitted[..], [Admitted::Existing(id)] if id == "elsewhere"), "{admitted:?}");
        assert_eq!(registry.open(), 0, "another replica's question is not open here");
        let mut other = asked("elsewhere");
        other.pipeline = "raisf".into();
        assert_eq!(registry.admit(vec![other]).unwrap_err(), AdmitError::Conflict("elsewhere".into()));
    }

    /// A batch whose explicit id is the id its sibling's key derives would be two questions under one
    /// id: open would count two and only one record would finish them, and 32 such POSTs would shut
    /// the door on everyone (issue 57, item 5). It is a conflict, and nothing is admitted.
    #[test]
    fn an_id_equal_to_a_siblings_derived_id_is_a_conflict_and_opens_nothing() {
        let registry = Registry::new(4, 10, 1 << 20);
        let keyed = NewQuestion { id: None, key: Some("order-17#1".into()), ..asked("") };
        let derived = idempotent_id(&keyed).unwrap();
        let batch = vec![asked(&derived), keyed];
        assert_eq!(registry.admit(batch).unwrap_err(), AdmitError::Conflict(derived));
        assert_eq!(registry.open(), 0);
    }

    fn published(registry: &Registry, asked: NewQuestion) -> crate::topics::Record {
        match registry.admit(vec![asked]).unwrap().pop() {
            Some(Admitted::New(question)) => question.to_record(),
            other => panic!("a new question, not {other:?}"),
        }
    }

    /// Two replicas that take the same question before either hears of the other's publish the same
    /// event, which the first stage finishes once (its dedupe window skips the twin); questions asked
    /// without an id or key stay distinct work.
    #[test]
    fn the_same_key_on_two_replicas_publishes_one_event_twice_not_two_questions() {
        use crate::actors::runner::dedupe::fingerprint;
        let (a, b) = (Registry::new(4, 10, 1 << 20), Registry::new(4, 10, 1 << 20));
        let keyed = NewQuestion { id: None, key: Some("order-17".into()), ..asked("") };
        let (on_a, on_b) = (published(&a, keyed.clone()), published(&b, keyed));
        assert_eq!(on_a.key, on_b.key, "one id from one key");
        assert!(on_a.key.starts_with("k-"), "{}", on_a.key);
        assert_eq!(fingerprint(&on_a), fingerprint(&on_b));
        assert_eq!(fingerprint(&published(&a, asked("x"))), fingerprint(&published(&b, asked("x"))));
        let anonymous = NewQuestion { id: None, ..asked("") };
        let (first, second) = (published(&a, anonymous.clone()), published(&b, anonymous));
        assert_ne!(first.key, second.key);
        assert_ne!(fingerprint(&first), fingerprint(&second));
    }

    fn error_record(id: &str, message: &str) -> VersionedAnswer {
        VersionedAnswer::from(AnswerRecord::Error(crate::topics::ErrorRecord {
            question_id: id.into(),
            question: "Who?".into(),
            stage: "leaf".into(),
            error_type: "llm_timeout".into(),
            message: message.into(),
            trace: Vec::new(),
            provenance: None,
        }))
    }

    fn step_of(id: &str) -> ProgressEvent {
        ProgressEvent {
            schema_version: crate::topics::SCHEMA_VERSION,
            question_id: id.into(),
            node: "root".into(),
            stage: "retrieve".into(),
            from: 0,
            steps: vec![TraceStep {
                stage: "retrieve".into(),
                iteration: 1,
                kind: TraceKind::QueriesWritten { queries: vec!["Who?".into()], dropped: Vec::new() },
            }],
        }
    }

    /// Progress lags the answers: a step of a question already answered and forgotten must not
    /// bring it back as an entry that never finishes.
    #[test]
    fn late_progress_of_a_forgotten_question_does_not_bring_it_back() {
        let registry = Registry::new(4, 1, 1 << 20);
        registry.finish("migres", error_record("first", "x"));
        registry.finish("migres", error_record("second", "x"));
        assert!(registry.get("first").is_none(), "forgotten past keep_finished = 1");
        registry.progress("migres", step_of("first"));
        assert!(registry.get("first").is_none(), "brought back by late progress");
        assert!(registry.list(10).iter().all(|s| s.id != "first"));
    }

    /// `keep_finished` counts questions; records differ in size by orders of magnitude, so the
    /// registry is bounded in bytes too, and forgets its oldest finished questions past it.
    #[test]
    fn past_its_byte_bound_the_registry_forgets_the_oldest_finished_questions() {
        let registry = Registry::new(4, 1000, 20_000);
        let long = "x".repeat(1000);
        for n in 0..100 {
            registry.finish("migres", error_record(&format!("q{n}"), &long));
        }
        assert!(registry.get("q99").is_some(), "the newest is kept");
        assert!(registry.get("q0").is_none(), "the oldest is forgotten");
        let kept = registry.list(1000).len();
        assert!((5..=20).contains(&kept), "{kept} records of about 1 kB kept under 20 kB");
    }
}
