//! relevance: RA-ISF's passage relevance module, and what follows from it (paper 003, Algorithm 1).
//! Each retrieved passage is judged relevant or not on its own; the relevant ones answer the
//! question. When none is, the question is decomposed into sub-questions that are solved like
//! questions of their own (fan-out through `nodes`, back through the join) until depth D_th, where a
//! node answers from what the model knows.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;

use crate::actors::clients::{LlmClient, Schema};
use crate::actors::evidence::{cite_shown, documents, read};
use crate::actors::fanout::{answer_node, expect_record};
use crate::actors::stage::{Stage, StageError, decode};
use crate::actors::{note_call, prompts};
use crate::settings::RaisfSettings;
use crate::topics::{
    Event, EvidenceEvent, EvidenceItem, Memory, NodeEvent, Outcome, Record, SCHEMA_VERSION, TraceKind,
    memory::normalize_query,
};

pub struct Relevance {
    /// The relevance module's endpoint (`raisf.relevance`).
    relevance: LlmClient,
    /// The decomposition module's endpoint (`raisf.decompose`).
    decompose: LlmClient,
    answerer: LlmClient,
    settings: RaisfSettings,
    deadline: std::time::Duration,
}

#[derive(Deserialize)]
struct Relevant {
    relevant: bool,
}

#[derive(Deserialize)]
struct SubQuestions {
    sub_questions: Vec<String>,
}

fn relevant_schema() -> Schema {
    Schema {
        name: "passage_relevance",
        schema: json!({
            "type": "object",
            "properties": { "relevant": { "type": "boolean" } },
            "required": ["relevant"],
            "additionalProperties": false,
        }),
    }
}

fn decompose_schema(max: usize) -> Schema {
    Schema {
        name: "decomposition",
        schema: json!({
            "type": "object",
            "properties": {
                "sub_questions": { "type": "array", "items": { "type": "string" }, "minItems": 1, "maxItems": max },
            },
            "required": ["sub_questions"],
            "additionalProperties": false,
        }),
    }
}

impl Relevance {
    pub fn new(
        relevance: LlmClient,
        decompose: LlmClient,
        answerer: LlmClient,
        settings: RaisfSettings,
        deadline: std::time::Duration,
    ) -> Self {
        Relevance { relevance, decompose, answerer, settings, deadline }
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

    /// Sub-questions that differ from the question and from each other, at most `max_sub_questions`.
    async fn decompose(&self, memory: &mut Memory) -> Result<Vec<String>, StageError> {
        let prompt = prompts::fill(prompts::DECOMPOSE, &[("question", &memory.question)]);
        let schema = decompose_schema(self.settings.max_sub_questions);
        let reply = self.decompose.structured::<SubQuestions>(prompts::SYSTEM, &prompt, &schema).await?;
        note_call(memory, Self::NAME, "decompose", &reply.stats);
        let mut seen = vec![normalize_query(&memory.question)];
        let mut kept = Vec::new();
        for question in reply.value.sub_questions {
            let question = question.trim().to_string();
            let normal = normalize_query(&question);
            if normal.is_empty() || seen.contains(&normal) {
                continue;
            }
            seen.push(normal);
            kept.push(question);
        }
        kept.truncate(self.settings.max_sub_questions);
        Ok(kept)
    }
}

#[async_trait(?Send)]
impl Stage for Relevance {
    const NAME: &'static str = "relevance";

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
        let depth = memory.node_ref().depth();
        let sub_questions =
            if depth < self.settings.max_depth { self.decompose(&mut memory).await? } else { Vec::new() };
        if sub_questions.is_empty() {
            // At D_th (or with nothing to split into): answer from what the model knows.
            let answer = read(&self.answerer, &mut memory, Self::NAME, "answer_at_depth_limit", "None").await?;
            return Ok(vec![answer_node(memory, Self::NAME, answer, Outcome::AnsweredAtLimit)]);
        }
        let children: Vec<Memory> =
            sub_questions.iter().enumerate().map(|(i, q)| memory.child(i as u32 + 1, q.clone())).collect();
        let named = children.iter().map(|c| (c.question_id.clone(), c.question.clone())).collect();
        memory.record(Self::NAME, TraceKind::FannedOut { children: named });
        let mut out = vec![expect_record(&memory, &children, self.deadline)];
        out.extend(children.into_iter().map(|memory| NodeEvent { schema_version: SCHEMA_VERSION, memory }.to_record()));
        Ok(out)
    }
}
