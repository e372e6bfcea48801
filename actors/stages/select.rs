//! select: the end of RQ-RAG (paper 004, Section 2.3). The join hands over the answers of every
//! trajectory below a node. Below the root they are passed up unchanged; at the root one is chosen by
//! the configured strategy (perplexity, confidence or ensemble: see `selection.rs`).
//!
//! Every trajectory's answer stays in the record (`candidates`), so eval can report the upper bound.

use async_trait::async_trait;

use crate::actors::prompts::NamedPrompt;
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::answer::deadline_error;
use crate::actors::shared::fanout::{is_root, result_record};
use crate::actors::shared::selection::choose_answer;
use crate::config::{Selection, Settings};
use crate::topics::{Candidate, JoinedEvent, Outcome, Record};

pub struct Select {
    selection: Selection,
}

impl Select {
    pub fn new(selection: Selection) -> Self {
        Select { selection }
    }
}

#[async_trait(?Send)]
impl Stage for Select {
    const NAME: &'static str = "select";

    /// Selection reads log-probabilities the trajectories brought; it asks no LLM.
    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        Vec::new()
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let JoinedEvent { memory, results, missing, .. } = decode(record)?;
        let candidates: Vec<Candidate> = results.into_iter().flat_map(|r| r.candidates).collect();
        if !is_root(&memory) {
            return Ok(vec![result_record(memory, candidates)]);
        }
        if candidates.is_empty() {
            return Ok(vec![deadline_error(memory, Self::NAME, &missing)]);
        }
        let outcome = if missing.is_empty() { Outcome::Answered } else { Outcome::AnsweredAfterDeadline };
        Ok(vec![choose_answer(memory, Self::NAME, candidates, self.selection, outcome)])
    }
}
