//! `answers`: the end of every question, exactly one record each: an answer with the facts it rests
//! on and the passages behind each fact, or an error saying which stage gave up and why.

use serde::{Deserialize, Serialize};

use super::{Candidate, Event, KnownFact, Memory, Passage, Topic, TraceStep, Usage};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The main module judged the known facts sufficient.
    Answered,
    /// T iterations passed (or no new query could be written): answered with what was known.
    AnsweredAtLimit,
    /// Some sub-questions or trajectories did not return by the join deadline: answered from those
    /// that did.
    AnsweredAfterDeadline,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::AnsweredAtLimit => "answered_at_limit",
            Outcome::AnsweredAfterDeadline => "answered_after_deadline",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Answered {
    pub question_id: String,
    pub question: String,
    pub answer: String,
    pub confidence: f32,
    pub explanation: String,
    pub outcome: Outcome,
    pub iterations: u32,
    pub facts: Vec<KnownFact>,
    /// Every passage some fact cites, by id.
    pub passages: Vec<Passage>,
    pub queries: Vec<String>,
    pub usage: Usage,
    /// Every answer the method arrived at before choosing (RQ-RAG's trajectories), for audit and
    /// for eval's upper bound.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Candidate>,
    /// Stages that went on without what they asked for (see [`super::TraceKind::Degraded`]): an
    /// answer with an empty list took the method's full path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<String>,
    /// Every step: stage, iteration and a `kind` with its fields (README, "What you get").
    #[schema(value_type = Vec<Object>)]
    pub trace: Vec<TraceStep>,
    /// What made this record (`topics/provenance.rs`), stamped by the runner of the stage that
    /// publishes it; absent in records of builds before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<super::Provenance>,
}

impl Answered {
    pub fn from_memory(memory: Memory, answer: String, confidence: f32, explanation: String, outcome: Outcome) -> Self {
        Answered {
            question_id: memory.question_id,
            question: memory.question,
            answer,
            confidence,
            explanation,
            outcome,
            iterations: memory.iteration,
            facts: memory.facts,
            passages: memory.cited_passages.into_values().collect(),
            queries: memory.queries,
            usage: memory.usage,
            candidates: Vec::new(),
            degraded: degraded_stages(&memory.trace),
            trace: memory.trace,
            provenance: None,
        }
    }
}

/// The stages with a degraded step, once each, in trace order; a fanned-out child's `leaf@1.2` counts
/// as `leaf`.
fn degraded_stages(trace: &[TraceStep]) -> Vec<String> {
    let mut stages: Vec<String> = Vec::new();
    for step in trace.iter().filter(|s| matches!(s.kind, super::TraceKind::Degraded { .. })) {
        let stage = step.stage.split('@').next().unwrap_or_default();
        if !stages.iter().any(|s| s == stage) {
            stages.push(stage.to_string());
        }
    }
    stages
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorRecord {
    pub question_id: String,
    /// Empty when the input could not be read far enough to know it.
    pub question: String,
    /// The stage that gave up (`input` for bad input).
    pub stage: String,
    /// One of a fixed set (`bad_input`, `llm_unreachable`, `llm_timeout`, `llm_bad_response`, ...).
    pub error_type: String,
    pub message: String,
    /// What was done before the failure, when known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub trace: Vec<TraceStep>,
    /// What made this record (`topics/provenance.rs`), stamped by the runner of the stage that
    /// publishes it; absent in records of builds before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<super::Provenance>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AnswerRecord {
    Answered(Box<Answered>),
    Error(ErrorRecord),
}

/// Answer records carry their own version beside the status tag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VersionedAnswer {
    pub schema_version: u32,
    #[serde(flatten)]
    pub record: AnswerRecord,
}

impl AnswerRecord {
    pub fn question_id(&self) -> &str {
        match self {
            AnswerRecord::Answered(a) => &a.question_id,
            AnswerRecord::Error(e) => &e.question_id,
        }
    }

    /// Where the record's provenance goes, and the trace it is read from.
    pub fn provenance_and_trace(&mut self) -> (&mut Option<super::Provenance>, &[TraceStep]) {
        match self {
            AnswerRecord::Answered(a) => (&mut a.provenance, &a.trace),
            AnswerRecord::Error(e) => (&mut e.provenance, &e.trace),
        }
    }
}

impl Event for VersionedAnswer {
    const TOPIC: Topic = Topic::Answers;
    fn key(&self) -> &str {
        self.record.question_id()
    }
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}

impl VersionedAnswer {
    /// What ends a question whose answer record this build cannot read (one of a later build,
    /// say) where it is read (`serve`, the sink): an error record that says so, so the question
    /// still ends in one record.
    pub fn unreadable(question_id: &str, reader: &str, reason: &str) -> Self {
        VersionedAnswer::from(AnswerRecord::Error(ErrorRecord {
            question_id: question_id.to_string(),
            question: String::new(),
            stage: reader.to_string(),
            error_type: "undecodable_record".into(),
            message: format!("{reader} cannot read the question's answer record: {reason}"),
            trace: Vec::new(),
            provenance: None,
        }))
    }
}

impl From<AnswerRecord> for VersionedAnswer {
    fn from(record: AnswerRecord) -> Self {
        VersionedAnswer { schema_version: super::SCHEMA_VERSION, record }
    }
}
