//! Reading questions: every input line becomes a question or an error record, never nothing.

use std::collections::HashSet;

use serde::Deserialize;

use crate::topics::{ErrorRecord, QuestionEvent};

/// One line of a questions file; extra fields (answers, gold passages, ...) are ignored.
#[derive(Deserialize)]
struct QuestionLine {
    #[serde(default)]
    id: Option<serde_json::Value>,
    question: Option<String>,
    /// The shared data marks yes/no questions with "type": "yes/no" (StrategyQA).
    #[serde(default, rename = "type")]
    kind: Option<serde_json::Value>,
}

/// A line's fate: a question to run, or an error record to write as it is.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Question(QuestionEvent),
    Rejected(ErrorRecord),
}

pub struct InputReader {
    max_chars: usize,
    seen: HashSet<String>,
}

impl InputReader {
    pub fn new(max_chars: usize) -> Self {
        InputReader { max_chars, seen: HashSet::new() }
    }

    /// Parses line `number` (1-based) of a questions file.
    pub fn line(&mut self, number: usize, line: &str) -> Option<Input> {
        if line.trim().is_empty() {
            return None;
        }
        let fallback_id = format!("line-{number}");
        let parsed: QuestionLine = match serde_json::from_str(line) {
            Ok(parsed) => parsed,
            Err(e) => {
                return Some(reject(
                    &fallback_id,
                    "",
                    format!("line {number} is not a JSON object with a question: {e}"),
                ));
            }
        };
        let id = match parsed.id {
            Some(serde_json::Value::String(s)) if !s.trim().is_empty() => s,
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => fallback_id,
        };
        let yes_no = parsed.kind.as_ref().and_then(|k| k.as_str()) == Some("yes/no");
        Some(match self.question(id, parsed.question.unwrap_or_default()) {
            Input::Question(question) => Input::Question(question.yes_no(yes_no)),
            rejected => rejected,
        })
    }

    /// Validates one question: not empty, not oversized, id not seen before.
    pub fn question(&mut self, id: String, question: String) -> Input {
        let question = match checked_question(&question, self.max_chars) {
            Ok(question) => question,
            Err(message) => return reject(&id, question.trim(), message),
        };
        // The answer sink keeps one record per id: a second question with the same id would vanish.
        if !self.seen.insert(id.clone()) {
            return reject(&id, &question, format!("duplicate question id {id:?}"));
        }
        Input::Question(QuestionEvent::new(id, question))
    }
}

/// The question as it will be asked (trimmed), or why it cannot be: empty, or over `max_chars`
/// (`run.max_question_chars`). Every way in (`lacuna run`, `submit`, `serve`) checks with this.
pub fn checked_question(question: &str, max_chars: usize) -> Result<String, String> {
    let question = question.trim();
    if question.is_empty() {
        return Err("the question is empty".to_string());
    }
    let chars = question.chars().count();
    if chars > max_chars {
        return Err(format!("the question has {chars} characters, more than run.max_question_chars = {max_chars}"));
    }
    Ok(question.to_string())
}

fn reject(id: &str, question: &str, message: String) -> Input {
    Input::Rejected(ErrorRecord {
        question_id: id.to_string(),
        question: question.to_string(),
        stage: "input".to_string(),
        error_type: "bad_input".to_string(),
        message,
        trace: Vec::new(),
        provenance: None,
    })
}
