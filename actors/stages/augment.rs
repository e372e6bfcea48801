//! augment: QPaug's first step (paper 002, Section 3). The model decomposes the question step by step
//! (zero-shot CoT, "Let's think step-by-step"); the question plus that augmentation is the retrieval
//! query (Eq. 4). The model then writes a passage of what it knows for the augmented question, or
//! [NONE] when it does not know (Figure 7); the reader shows it after the K-1 retrieved passages as
//! "Your knowledge" (Figure 6).

use async_trait::async_trait;

use crate::actors::clients::LlmClient;
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::note_call;
use crate::config::Settings;
use crate::topics::{Event, QueriesEvent, QuestionEvent, Record, SCHEMA_VERSION, TraceKind};

pub struct Augment {
    llm: LlmClient,
}

impl Augment {
    pub fn new(llm: LlmClient) -> Self {
        Augment { llm }
    }
}

/// The model's way of saying it has no passage to offer.
pub const NONE: &str = "[NONE]";

#[async_trait(?Send)]
impl Stage for Augment {
    const NAME: &'static str = "augment";

    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        vec![("augment", prompts::AUGMENT), ("generate_passage", prompts::GENERATE_PASSAGE)]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let mut memory = decode::<QuestionEvent>(record)?.memory();
        let prompt = prompts::fill(prompts::AUGMENT, &[("question", &memory.question)]);
        let reply = self.llm.text(prompts::SYSTEM, &prompt).await?;
        note_call(&mut memory, Self::NAME, "question_augmentation", &reply.stats);
        let augmentation = reply.value.trim().to_string();
        let augmented = format!("{} {augmentation}", memory.question).trim().to_string();

        let prompt = prompts::fill(prompts::GENERATE_PASSAGE, &[("question", &augmented)]);
        let reply = self.llm.text(prompts::SYSTEM, &prompt).await?;
        note_call(&mut memory, Self::NAME, "passage_generation", &reply.stats);
        // The prompt (paper 002, Figure 7) asks for [DONE] after the passage.
        let passage = reply.value.split("[DONE]").next().unwrap_or_default().trim().to_string();
        memory.usage.knowledge_tokens += reply.stats.completion_tokens;
        memory.record(
            Self::NAME,
            TraceKind::Augmented { augmentation: augmentation.clone(), generated_passage: passage.clone() },
        );
        // [NONE] (or nothing) means no passage: the reader then sees only the retrieved ones.
        memory.generated_passage = (!passage.is_empty() && !passage.contains(NONE)).then_some(passage);
        memory.queries.push(augmented.clone());
        Ok(vec![QueriesEvent { schema_version: SCHEMA_VERSION, memory, queries: vec![augmented] }.to_record()])
    }
}
