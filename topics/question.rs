//! `questions`: what users submit. The only event without memory: retrieve creates it.

use serde::{Deserialize, Serialize};

use super::{Event, Topic};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuestionEvent {
    pub schema_version: u32,
    pub id: String,
    pub question: String,
}

impl QuestionEvent {
    pub fn new(id: impl Into<String>, question: impl Into<String>) -> Self {
        QuestionEvent { schema_version: super::SCHEMA_VERSION, id: id.into(), question: question.into() }
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
