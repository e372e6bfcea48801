//! How a question ends: the final answer a stage must give, the answer and error records that go to
//! the answers topic (counted in the answer metrics), and the one answer normalisation that both the
//! stages (comparing candidate answers) and `lacuna eval` (scoring) use.

use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::Schema;
use crate::actors::clients::schema::Confidence;
use crate::metrics::METRICS;
use crate::topics::{AnswerRecord, Answered, ErrorRecord, Event, Memory, Outcome, Record, TraceKind, VersionedAnswer};

/// An answer that must be given: see [`given_answer`].
#[derive(Deserialize, JsonSchema)]
pub struct FinalAnswer {
    // Reasoning first: the model explains before it commits to an answer.
    pub explanation: String,
    pub answer: String,
    #[schemars(with = "Confidence")]
    pub confidence: f32,
}

/// The schema of a [`FinalAnswer`].
pub fn final_schema() -> Schema {
    Schema::of::<FinalAnswer>("final_answer")
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
            held_back: None,
        },
    );
    answer_record(memory, answer, given.confidence, given.explanation, outcome)
}

/// The answer record of a question, counted in the answer metrics.
pub fn answer_record(memory: Memory, answer: String, confidence: f32, explanation: String, outcome: Outcome) -> Record {
    answer_record_with(Answered::from_memory(memory, answer, confidence, explanation, outcome))
}

/// Publishes a finished answer, counted in the answer metrics. The answer loses the punctuation
/// around it that belongs to no name (quote marks, a closing period).
pub fn answer_record_with(mut answered: Answered) -> Record {
    answered.answer = super::span::strip_stray_punctuation(&answered.answer);
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
        provenance: None,
    })
}

/// SQuAD's `normalize_answer`, exactly: lower case, ASCII punctuation removed (not replaced: "U.S."
/// is "us", "8,515" is "8515"), the words a/an/the removed, white space collapsed.
pub fn normalize_answer(text: &str) -> String {
    let no_punct: String = text.to_lowercase().chars().filter(|c| !c.is_ascii_punctuation()).collect();
    without_articles(&no_punct).split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The words of normalised `part` form a contiguous run of the words of normalised `text` (cover
/// EM's test, and the stages' test that an answer names an option).
pub fn contains_words(text: &str, part: &str) -> bool {
    let (t, p): (Vec<&str>, Vec<&str>) = (text.split(' ').collect(), part.split(' ').collect());
    t.windows(p.len()).any(|window| window == p.as_slice())
}

/// Python's `re.sub(r"\b(a|an|the)\b", " ", text)`: a run of word characters that is exactly an
/// article becomes a space. Runs are split at any non-word character, not only at white space, as
/// `\b` is ("“the" loses its article).
fn without_articles(text: &str) -> String {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if matches!(run.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if is_word(c) {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}
