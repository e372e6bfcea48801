//! `questions`: what users submit. The only event without memory: retrieve creates it.

use serde::{Deserialize, Serialize};

use super::{Event, Topic};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuestionEvent {
    pub schema_version: u32,
    pub id: String,
    pub question: String,
    /// The answer must be "yes" or "no" (StrategyQA-style questions): the answering prompts say so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub yes_no: bool,
}

impl QuestionEvent {
    pub fn new(id: impl Into<String>, question: impl Into<String>) -> Self {
        QuestionEvent { schema_version: super::SCHEMA_VERSION, id: id.into(), question: question.into(), yes_no: false }
    }

    pub fn yes_no(self, yes_no: bool) -> Self {
        QuestionEvent { yes_no, ..self }
    }
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
