//! compose: RA-ISF's last step for a decomposed question (paper 003, Algorithm 1): once the join has
//! the sub-questions' answers, the question is answered from them. A root whose sub-questions did
//! not all return by the deadline is answered from those that did, or ends in an error record.

use async_trait::async_trait;

use crate::actors::clients::LlmClient;
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::answer::deadline_error;
use crate::actors::shared::evidence::{documents, read};
use crate::actors::shared::fanout::{answer_node, is_root};
use crate::config::Settings;
use crate::topics::{JoinedEvent, Outcome, Record};

pub struct Compose {
    llm: LlmClient,
}

impl Compose {
    pub fn new(llm: LlmClient) -> Self {
        Compose { llm }
    }
}

#[async_trait(?Send)]
impl Stage for Compose {
    const NAME: &'static str = "compose";

    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        vec![("reader", prompts::READER)]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let JoinedEvent { mut memory, results, missing, .. } = decode(record)?;
        if results.is_empty() && is_root(&memory) {
            return Ok(vec![deadline_error(memory, Self::NAME, &missing)]);
        }
        // Each sub-question with its answer is one document of the answer prompt.
        let pairs: Vec<(String, String)> = results
            .iter()
            .map(|r| {
                let answer = r.candidates.first().map_or("unknown", |c| c.answer.as_str());
                (r.question.clone(), answer.to_string())
            })
            .collect();
        let docs = documents(pairs.iter().map(|(q, a)| (q.as_str(), a.as_str())));
        let answer = read(&self.llm, &mut memory, Self::NAME, "answer_from_sub_answers", &docs).await?;
        let outcome = if missing.is_empty() { Outcome::Answered } else { Outcome::AnsweredAfterDeadline };
        Ok(vec![answer_node(memory, Self::NAME, answer, outcome)])
    }
}
