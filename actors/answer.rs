//! How a question ends: the final answer a stage must give, the answer and error records that go to
//! the answers topic (counted in the answer metrics), and the one answer normalisation that both the
//! stages (comparing candidate answers) and `lacuna eval` (scoring) use.

use serde::Deserialize;
use serde_json::json;

use crate::actors::clients::Schema;
use crate::metrics::METRICS;
use crate::topics::{AnswerRecord, Answered, ErrorRecord, Event, Memory, Outcome, Record, TraceKind, VersionedAnswer};

/// An answer that must be given: see [`given_answer`].
#[derive(Deserialize)]
pub struct FinalAnswer {
    pub answer: String,
    pub confidence: f32,
    pub explanation: String,
}

/// The 1-5 confidence every answering schema asks for.
pub fn confidence_schema() -> serde_json::Value {
    json!({ "type": "integer", "enum": [1, 2, 3, 4, 5] })
}

/// The schema of a [`FinalAnswer`].
pub fn final_schema() -> Schema {
    Schema {
        name: "final_answer",
        schema: json!({
            "type": "object",
            "properties": {
                "answer": { "type": "string" },
                "confidence": confidence_schema(),
                "explanation": { "type": "string" },
            },
            "required": ["answer", "confidence", "explanation"],
            "additionalProperties": false,
        }),
    }
}

/// Ends a question with an answer that had to be given (MIGRES at the limit, the baselines' reader):
/// the decision goes into the trace, the record to the answers topic.
pub fn given_answer(mut memory: Memory, stage: &str, given: FinalAnswer, outcome: Outcome) -> Record {
    let answer = given.answer.trim().to_string();
    memory.record(
        stage,
        TraceKind::Decision {
            answerable: true,
            answer: answer.clone(),
            confidence: given.confidence,
            missing_information: String::new(),
            forced: outcome == Outcome::AnsweredAtLimit,
        },
    );
    answer_record(memory, answer, given.confidence, given.explanation, outcome)
}

/// The answer record of a question, counted in the answer metrics.
pub fn answer_record(memory: Memory, answer: String, confidence: f32, explanation: String, outcome: Outcome) -> Record {
    answer_record_with(Answered::from_memory(memory, answer, confidence, explanation, outcome))
}

/// Publishes a finished answer, counted in the answer metrics.
pub fn answer_record_with(answered: Answered) -> Record {
    let m = &METRICS;
    m.answers.with_label_values(&[answered.outcome.name()]).inc();
    m.answer_iterations.with_label_values::<&str>(&[]).observe(answered.iterations as f64);
    m.answer_llm_calls.with_label_values::<&str>(&[]).observe(answered.usage.llm_calls as f64);
    m.answer_passages.with_label_values::<&str>(&[]).observe(answered.passages.len() as f64);
    VersionedAnswer::from(AnswerRecord::Answered(Box::new(answered))).to_record()
}

/// The error record that ends a question, counted in the answer metrics.
pub fn error_record(record: ErrorRecord) -> Record {
    METRICS.answers.with_label_values(&["error"]).inc();
    VersionedAnswer::from(AnswerRecord::Error(record)).to_record()
}

/// The error record of a root question none of whose children returned by the join's deadline.
pub fn deadline_error(memory: Memory, stage: &str, missing: &[String]) -> Record {
    error_record(ErrorRecord {
        question_id: memory.question_id,
        question: memory.question,
        stage: stage.to_string(),
        error_type: "deadline_exceeded".to_string(),
        message: format!(
            "no sub-question or trajectory returned by the join deadline (waiting for {})",
            missing.join(", ")
        ),
        trace: memory.trace,
    })
}

/// SQuAD normalisation: lower case, punctuation removed, articles removed, white space collapsed.
pub fn normalize_answer(text: &str) -> String {
    let lower = text.to_lowercase();
    let no_punct: String =
        lower.chars().map(|c| if c.is_ascii_punctuation() || is_quote(c) { ' ' } else { c }).collect();
    no_punct.split_whitespace().filter(|w| !matches!(*w, "a" | "an" | "the")).collect::<Vec<_>>().join(" ")
}

fn is_quote(c: char) -> bool {
    matches!(c, '\u{2018}' | '\u{2019}' | '\u{201c}' | '\u{201d}')
}
