//! `questions`: what users submit. The only event without memory: the stage that takes it (retrieve,
//! augment or self_knowledge) starts one.

use serde::{Deserialize, Serialize};

use super::{Event, Memory, Topic};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuestionEvent {
    pub schema_version: u32,
    pub id: String,
    pub question: String,
    /// The answer must be "yes" or "no" (StrategyQA-style questions): the answering prompts say so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub yes_no: bool,
    /// Unique per submission: the same question asked again is new work, not a duplicate to skip
    /// (`actors/dedupe.rs`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub submission: String,
}

impl QuestionEvent {
    pub fn new(id: impl Into<String>, question: impl Into<String>) -> Self {
        QuestionEvent {
            schema_version: super::SCHEMA_VERSION,
            id: id.into(),
            question: question.into(),
            yes_no: false,
            submission: submission_id(),
        }
    }

    /// A question asked idempotently (serve, with the client's id or an `Idempotency-Key`): the same
    /// id and text submitted twice, by any replica, is one piece of work, so the submission is not
    /// unique and a stage that finished the first copy skips the second.
    pub fn idempotent(self) -> Self {
        QuestionEvent { submission: IDEMPOTENT.to_string(), ..self }
    }

    pub fn yes_no(self, yes_no: bool) -> Self {
        QuestionEvent { yes_no, ..self }
    }

    /// The memory a question starts with, in whichever stage starts it.
    pub fn memory(&self) -> Memory {
        let mut memory = Memory::new(self.id.clone(), self.question.clone());
        memory.yes_no = self.yes_no;
        memory.submission = self.submission.clone();
        memory
    }
}

/// The time in nanoseconds, the process and a counter: unique enough to tell two submissions apart.
/// The submission of every [`QuestionEvent::idempotent`] question.
const IDEMPOTENT: &str = "idempotent";

fn submission_id() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{nanos:x}-{:x}-{count:x}", std::process::id())
}

impl Event for QuestionEvent {
    const TOPIC: Topic = Topic::Questions;
    fn key(&self) -> &str {
        &self.id
    }
    fn schema_version(&self) -> u32 {
        self.schema_version
    }
}
