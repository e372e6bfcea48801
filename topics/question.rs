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
}

impl QuestionEvent {
    pub fn new(id: impl Into<String>, question: impl Into<String>) -> Self {
        QuestionEvent { schema_version: super::SCHEMA_VERSION, id: id.into(), question: question.into(), yes_no: false }
    }

    pub fn yes_no(self, yes_no: bool) -> Self {
        QuestionEvent { yes_no, ..self }
    }

    /// The memory a question starts with, in whichever stage starts it.
    pub fn memory(&self) -> Memory {
        let mut memory = Memory::new(self.id.clone(), self.question.clone());
        memory.yes_no = self.yes_no;
        memory
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
