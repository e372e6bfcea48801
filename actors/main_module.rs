//! main_module: the MIGRES main module (stage `main`). Given only the verified facts it answers (with confidence and
//! explanation) or says "unanswerable" and names the missing information, which sends the question
//! round the loop again. At the iteration limit it answers with what is known.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;

use crate::actors::answer::{FinalAnswer, answer_record, confidence_schema, final_schema, given_answer};
use crate::actors::clients::{LlmClient, Schema};
use crate::actors::stage::{Stage, StageError, decode};
use crate::actors::{note_call, prompts};
use crate::settings::MigresSettings;
use crate::topics::{Event, Memory, MissingEvent, Outcome, Record, SCHEMA_VERSION, TraceKind, VerifiedEvent};

pub struct Main {
    llm: LlmClient,
    settings: MigresSettings,
}

#[derive(Deserialize)]
struct Decision {
    answerable: bool,
    answer: String,
    confidence: f32,
    explanation: String,
    missing_information: String,
}

fn decision_schema() -> Schema {
    Schema {
        name: "main_decision",
        schema: json!({
            "type": "object",
            "properties": {
                "answerable": { "type": "boolean" },
                "answer": { "type": "string" },
                "confidence": confidence_schema(),
                "explanation": { "type": "string" },
                "missing_information": { "type": "string" },
            },
            "required": ["answerable", "answer", "confidence", "explanation", "missing_information"],
            "additionalProperties": false,
        }),
    }
}

impl Main {
    pub fn new(llm: LlmClient, settings: MigresSettings) -> Self {
        Main { llm, settings }
    }

    async fn decide(&self, mut memory: Memory) -> Result<Record, StageError> {
        if memory.exhausted {
            return self.answer_at_limit(memory).await;
        }
        // An iteration that found no new fact cannot change the verdict: reuse the last missing
        // information instead of asking again (as the MIGRES code does).
        if memory.iteration > 1 && memory.new_facts() == 0 && !memory.last_missing.is_empty() {
            if memory.iteration >= self.settings.max_iterations {
                return self.answer_at_limit(memory).await;
            }
            let missing_information = memory.last_missing.clone();
            return Ok(MissingEvent { schema_version: SCHEMA_VERSION, memory, missing_information }.to_record());
        }

        let prompt = prompts::fill(
            prompts::MAIN,
            &[("facts", &memory.facts_text()), ("question", &memory.question_to_answer())],
        );
        let reply = self.llm.structured::<Decision>(prompts::SYSTEM, &prompt, &decision_schema()).await?;
        note_call(&mut memory, Self::NAME, "main", &reply.stats);
        let d = reply.value;
        let answer = d.answer.trim().to_string();
        // The MIGRES code's test is the word "unanswerable"; the flag alone is not trusted.
        let answerable = d.answerable && !answer.is_empty() && !answer.to_lowercase().contains("unanswerable");
        memory.record(
            Self::NAME,
            TraceKind::Decision {
                answerable,
                answer: answer.clone(),
                confidence: d.confidence,
                missing_information: d.missing_information.clone(),
                forced: false,
            },
        );
        if answerable {
            return Ok(answer_record(memory, answer, d.confidence, d.explanation, Outcome::Answered));
        }
        if memory.iteration >= self.settings.max_iterations {
            return self.answer_at_limit(memory).await;
        }
        // A too-short summary says nothing; the explanation names what is missing instead.
        let missing_information =
            if d.missing_information.trim().chars().count() < 10 { d.explanation } else { d.missing_information };
        memory.last_missing = missing_information.clone();
        Ok(MissingEvent { schema_version: SCHEMA_VERSION, memory, missing_information }.to_record())
    }

    /// T iterations passed or no new query can be written: answer from the known facts, and from
    /// the model's own knowledge where they fall short.
    async fn answer_at_limit(&self, mut memory: Memory) -> Result<Record, StageError> {
        let prompt = prompts::fill(
            prompts::FINAL_ANSWER,
            &[("facts", &memory.facts_text()), ("question", &memory.question_to_answer())],
        );
        let reply = self.llm.structured::<FinalAnswer>(prompts::SYSTEM, &prompt, &final_schema()).await?;
        note_call(&mut memory, Self::NAME, "final_answer", &reply.stats);
        Ok(given_answer(memory, Self::NAME, reply.value, Outcome::AnsweredAtLimit))
    }
}

#[async_trait(?Send)]
impl Stage for Main {
    const NAME: &'static str = "main";

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let event: VerifiedEvent = decode(record)?;
        Ok(vec![self.decide(event.memory).await?])
    }
}
