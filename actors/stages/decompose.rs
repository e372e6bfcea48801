//! decompose: RA-ISF's question decomposition module (paper 003, Algorithm 1). A (sub-)question none
//! of whose passages the relevance module found relevant arrives on `missing`. Below depth D_th it is
//! split into sub-questions that are solved like questions of their own (fan-out through `nodes`,
//! back through the join); at D_th, or when nothing differs from the question, the node answers from
//! what the model knows.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::{LlmClient, Schema};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::note_call;
use crate::actors::shared::evidence::read;
use crate::actors::shared::fanout::{answer_node, expect_record};
use crate::config::{RaisfSettings, Settings};
use crate::topics::memory::normalize_query;
use crate::topics::{Event, Memory, MissingEvent, NodeEvent, Outcome, Record, SCHEMA_VERSION, TraceKind};

pub struct Decompose {
    /// The decomposition module's endpoint (`raisf.decompose`).
    decompose: LlmClient,
    answerer: LlmClient,
    settings: RaisfSettings,
    deadline: std::time::Duration,
}

#[derive(Deserialize, JsonSchema)]
struct SubQuestions {
    /// At most `raisf.max_sub_questions`, a bound the schema gets from the settings.
    #[schemars(length(min = 1))]
    sub_questions: Vec<String>,
}

fn decompose_schema(max: usize) -> Schema {
    Schema::of::<SubQuestions>("decomposition").with_max_items("sub_questions", max)
}

impl Decompose {
    pub fn new(
        decompose: LlmClient,
        answerer: LlmClient,
        settings: RaisfSettings,
        deadline: std::time::Duration,
    ) -> Self {
        Decompose { decompose, answerer, settings, deadline }
    }

    /// Sub-questions that differ from the question and from each other, at most `max_sub_questions`.
    async fn sub_questions(&self, memory: &mut Memory) -> Result<Vec<String>, StageError> {
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
impl Stage for Decompose {
    const NAME: &'static str = "decompose";

    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        vec![("decompose", prompts::DECOMPOSE), ("reader", prompts::READER)]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let MissingEvent { mut memory, .. } = decode(record)?;
        let depth = memory.node_ref().depth();
        let sub_questions =
            if depth < self.settings.max_depth { self.sub_questions(&mut memory).await? } else { Vec::new() };
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
