//! reader: the baselines' answer step (paper Table 3, VANILLA and VANILLA-s). One LLM call answers
//! the question from the evidence sentence_filter selected; there is no loop, no fact extraction and
//! no entailment check. The passages shown are the answer's citations.

use async_trait::async_trait;

use crate::actors::clients::LlmClient;
use crate::actors::main::{FinalAnswer, final_schema, given_answer};
use crate::actors::stage::{Stage, StageError, decode};
use crate::actors::{note_call, prompts};
use crate::topics::{EvidenceEvent, EvidenceOrigin, Outcome, Passage, Record, Topic};

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

    fn inputs(&self) -> &'static [Topic] {
        &[Topic::Evidence]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let EvidenceEvent { mut memory, evidence, .. } = decode(record)?;
        let documents = if evidence.is_empty() {
            "None".to_string()
        } else {
            let lines = evidence.iter().enumerate().map(|(i, e)| format!("[{}] {}: {}", i + 1, e.title, e.text));
            lines.collect::<Vec<_>>().join("\n")
        };
        let prompt =
            prompts::fill(prompts::READER, &[("documents", &documents), ("question", &memory.question_to_answer())]);
        let reply = self.llm.structured::<FinalAnswer>(prompts::SYSTEM, &prompt, &final_schema()).await?;
        note_call(&mut memory, Self::NAME, "answer", &reply.stats);
        // The answer rests on what was shown: those passages (as shown) are its citations.
        for item in evidence.into_iter().filter(|e| e.origin == EvidenceOrigin::Passage) {
            let passage = Passage { id: item.id.clone(), title: item.title, text: item.text };
            memory.cited_passages.insert(item.id, passage);
        }
        Ok(vec![given_answer(memory, Self::NAME, reply.value, Outcome::Answered)])
    }
}
