//! reader: the baselines' answer step (paper Table 3, VANILLA and VANILLA-s). One LLM call answers
//! the question from the evidence sentence_filter selected; there is no loop, no fact extraction and
//! no entailment check. The passages shown are the answer's citations.
//!
//! QPaug's answer is this stage too: its self-generated passage is shown last, as "Your knowledge".
//! The other pipelines' answer calls go through [`read`].

use async_trait::async_trait;

use crate::actors::clients::LlmClient;
use crate::actors::main::{FinalAnswer, final_schema, given_answer};
use crate::actors::stage::{Stage, StageError, decode};
use crate::actors::{note_call, prompts};
use crate::topics::{EvidenceEvent, EvidenceItem, EvidenceOrigin, Memory, Outcome, Passage, Record, Topic};

/// The label of QPaug's self-generated passage (paper 002).
pub const YOUR_KNOWLEDGE: &str = "Your knowledge";

pub struct Reader {
    llm: LlmClient,
}

impl Reader {
    pub fn new(llm: LlmClient) -> Self {
        Reader { llm }
    }
}

/// Numbered `[i] title: text` lines, or "None".
pub(crate) fn documents<'a>(items: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let lines: Vec<String> =
        items.enumerate().map(|(i, (title, text))| format!("[{}] {title}: {text}", i + 1)).collect();
    if lines.is_empty() { "None".to_string() } else { lines.join("\n") }
}

/// One answer call over `documents` (the reader prompt), counted in the memory's usage and trace.
pub(crate) async fn read(
    llm: &LlmClient,
    memory: &mut Memory,
    stage: &str,
    purpose: &str,
    documents: &str,
) -> Result<FinalAnswer, StageError> {
    let prompt =
        prompts::fill(prompts::READER, &[("documents", documents), ("question", &memory.question_to_answer())]);
    let reply = llm.structured::<FinalAnswer>(prompts::SYSTEM, &prompt, &final_schema()).await?;
    note_call(memory, stage, purpose, &reply.stats);
    Ok(reply.value)
}

/// The answer rests on what was shown: those passages (as shown) become its citations.
pub(crate) fn cite_shown<'a>(memory: &mut Memory, evidence: impl IntoIterator<Item = &'a EvidenceItem>) {
    for item in evidence.into_iter().filter(|e| e.origin == EvidenceOrigin::Passage) {
        let passage = Passage { id: item.id.clone(), title: item.title.clone(), text: item.text.clone() };
        memory.cited_passages.insert(item.id.clone(), passage);
    }
}

#[async_trait(?Send)]
impl Stage for Reader {
    const NAME: &'static str = "reader";

    fn inputs(&self) -> &'static [Topic] {
        &[Topic::Evidence]
    }

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
