//! reader: the baselines' answer step (paper Table 3, VANILLA and VANILLA-s). One LLM call answers
//! the question from the evidence sentence_filter selected; there is no loop, no fact extraction and
//! no entailment check. The passages shown are the answer's citations.
//!
//! QPaug's answer is this stage too: its self-generated passage is shown last, as "Your knowledge".
//! The other pipelines' answer calls go through the same [`read`].

use async_trait::async_trait;

use crate::actors::answer::given_answer;
use crate::actors::clients::LlmClient;
use crate::actors::evidence::{YOUR_KNOWLEDGE, cite_shown, documents, read};
use crate::actors::stage::{Stage, StageError, decode};
use crate::topics::{EvidenceEvent, Outcome, Record};

pub struct Reader {
    llm: LlmClient,
}

impl Reader {
    pub fn new(llm: LlmClient) -> Self {
        Reader { llm }
    }
}

#[async_trait(?Send)]
impl Stage for Reader {
    const NAME: &'static str = "reader";

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let EvidenceEvent { mut memory, evidence, .. } = decode(record)?;
        let generated = memory.generated_passage.clone();
        let shown = evidence.iter().map(|e| (e.title.as_str(), e.text.as_str()));
        let docs = documents(shown.chain(generated.as_deref().map(|text| (YOUR_KNOWLEDGE, text))));
        let answer = read(&self.llm, &mut memory, Self::NAME, "answer", &docs).await?;
        cite_shown(&mut memory, &evidence);
        Ok(vec![given_answer(memory, Self::NAME, answer, Outcome::Answered)])
    }
}
