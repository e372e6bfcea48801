//! self_knowledge: RA-ISF's first module (paper 003, Algorithm 1). Asked whether it can answer a
//! (sub-)question from what it knows, the model either answers at once or sends the question to
//! retrieval. Roots come from `questions`, sub-questions from `nodes`.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::{LlmClient, Schema};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::note_call;
use crate::actors::shared::evidence::read;
use crate::actors::shared::fanout::answer_node;
use crate::config::Settings;
use crate::topics::{Event, NodeEvent, Outcome, QueriesEvent, QuestionEvent, Record, SCHEMA_VERSION, Topic, TraceKind};

pub struct SelfKnowledge {
    /// The self-knowledge module's own endpoint (`raisf.self_knowledge`); `None` skips the module.
    module: Option<LlmClient>,
    /// Answers when the model knows.
    answerer: LlmClient,
}

#[derive(Deserialize, JsonSchema)]
struct Known {
    known: bool,
}

fn known_schema() -> Schema {
    Schema::of::<Known>("self_knowledge")
}

impl SelfKnowledge {
    pub fn new(module: Option<LlmClient>, answerer: LlmClient) -> Self {
        SelfKnowledge { module, answerer }
    }
}

#[async_trait(?Send)]
impl Stage for SelfKnowledge {
    const NAME: &'static str = "self_knowledge";

    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        vec![("self_knowledge", prompts::SELF_KNOWLEDGE), ("reader", prompts::READER)]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let mut memory = match record.topic {
            Topic::Questions => decode::<QuestionEvent>(record)?.memory(),
            _ => decode::<NodeEvent>(record)?.memory,
        };
        if let Some(module) = &self.module {
            let prompt = prompts::fill(prompts::SELF_KNOWLEDGE, &[("question", &memory.question)]);
            let reply = module.structured::<Known>(prompts::SYSTEM, &prompt, &known_schema()).await?;
            note_call(&mut memory, Self::NAME, "self_knowledge", &reply.stats);
            let known = reply.value.known;
            memory.record(Self::NAME, TraceKind::SelfKnowledge { known });
            if known {
                let answer = read(&self.answerer, &mut memory, Self::NAME, "answer", "None").await?;
                return Ok(vec![answer_node(memory, Self::NAME, answer, Outcome::Answered)]);
            }
        }
        let queries = vec![memory.question.clone()];
        memory.queries.extend(queries.clone());
        Ok(vec![QueriesEvent { schema_version: SCHEMA_VERSION, memory, queries }.to_record()])
    }
}
