//! relevance: RA-ISF's passage relevance module (paper 003, Algorithm 1). Each retrieved passage is
//! judged relevant or not on its own; the relevant ones answer the question. When none is, the
//! question goes on `missing` to `decompose`.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::{LlmClient, Schema};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::note_call;
use crate::actors::shared::evidence::{cite_shown, documents, read};
use crate::actors::shared::fanout::answer_node;
use crate::config::Settings;
use crate::topics::{
    Event, EvidenceEvent, EvidenceItem, Memory, MissingEvent, Outcome, Record, SCHEMA_VERSION, TraceKind,
};

pub struct Relevance {
    /// The relevance module's endpoint (`raisf.relevance`).
    relevance: LlmClient,
    answerer: LlmClient,
}

#[derive(Deserialize, JsonSchema)]
struct Relevant {
    relevant: bool,
}

fn relevant_schema() -> Schema {
    Schema::of::<Relevant>("passage_relevance")
}

impl Relevance {
    pub fn new(relevance: LlmClient, answerer: LlmClient) -> Self {
        Relevance { relevance, answerer }
    }

    async fn is_relevant(&self, memory: &mut Memory, item: &EvidenceItem) -> Result<bool, StageError> {
        let passage = format!("{}: {}", item.title, item.text);
        let prompt = prompts::fill(prompts::RELEVANCE, &[("passage", &passage), ("question", &memory.question)]);
        let reply = self.relevance.structured::<Relevant>(prompts::SYSTEM, &prompt, &relevant_schema()).await?;
        note_call(memory, Self::NAME, "relevance", &reply.stats);
        let relevant = reply.value.relevant;
        memory.record(Self::NAME, TraceKind::Relevance { passage_id: item.id.clone(), relevant });
        Ok(relevant)
    }
}

#[async_trait(?Send)]
impl Stage for Relevance {
    const NAME: &'static str = "relevance";

    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        vec![("relevance", prompts::RELEVANCE), ("reader", prompts::READER)]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let EvidenceEvent { mut memory, evidence, .. } = decode(record)?;
        let mut relevant = Vec::new();
        for item in &evidence {
            if self.is_relevant(&mut memory, item).await? {
                relevant.push(item);
            }
        }
        if !relevant.is_empty() {
            let docs = documents(relevant.iter().map(|e| (e.title.as_str(), e.text.as_str())));
            let answer = read(&self.answerer, &mut memory, Self::NAME, "answer", &docs).await?;
            cite_shown(&mut memory, relevant);
            return Ok(vec![answer_node(memory, Self::NAME, answer, Outcome::Answered)]);
        }
        let missing_information = "no retrieved passage is relevant to the question".to_string();
        Ok(vec![MissingEvent { schema_version: SCHEMA_VERSION, memory, missing_information }.to_record()])
    }
}
