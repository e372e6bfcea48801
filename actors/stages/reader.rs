//! reader: the baselines' answer step (paper Table 3, VANILLA and VANILLA-s). One LLM call answers
//! the question from the evidence sentence_filter selected; there is no loop, no fact extraction and
//! no entailment check. The passages shown are the answer's citations.
//!
//! QPaug's answer is this stage too: its self-generated passage is shown last, as "Your knowledge".
//! The other pipelines' answer calls go through the same [`read`].

use async_trait::async_trait;

use crate::actors::clients::LlmClient;
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::answer::given_answer;
use crate::actors::shared::evidence::{YOUR_KNOWLEDGE, cite_shown, documents, read_settled};
use crate::config::Settings;
use crate::topics::{EvidenceEvent, Outcome, Record};

pub struct Reader {
    llm: LlmClient,
    /// `reader.compare_options`: two-option comparisons decided in code (`two_options`).
    compare_options: bool,
}

impl Reader {
    pub fn new(llm: LlmClient, compare_options: bool) -> Self {
        Reader { llm, compare_options }
    }
}

#[async_trait(?Send)]
impl Stage for Reader {
    const NAME: &'static str = "reader";

    fn prompts(settings: &Settings) -> Vec<NamedPrompt> {
        let mut used = vec![("reader", prompts::READER)];
        if settings.reader.compare_options {
            used.push(("compare_options", prompts::COMPARE_OPTIONS));
        }
        used
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let EvidenceEvent { mut memory, evidence, .. } = decode(record)?;
        let generated = memory.generated_passage.clone();
        let shown = evidence.iter().map(|e| (e.title.as_str(), e.text.as_str()));
        let docs = documents(shown.chain(generated.as_deref().map(|text| (YOUR_KNOWLEDGE, text))));
        let answer = read_settled(&self.llm, &mut memory, Self::NAME, "answer", &docs, self.compare_options).await?;
        cite_shown(&mut memory, &evidence);
        Ok(vec![given_answer(memory, Self::NAME, answer, Outcome::Answered)])
    }
}
