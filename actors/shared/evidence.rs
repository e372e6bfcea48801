//! Evidence as the answering prompts show it, and as answers cite it: numbered documents, one answer
//! call over them, and the shown passages recorded as the answer's citations. The baselines' reader,
//! QPaug, RA-ISF's modules and RQ-RAG's trajectories all answer this way.

use crate::actors::clients::LlmClient;
use crate::actors::prompts;
use crate::actors::runner::StageError;
use crate::actors::shared::accounting::note_call;
use crate::actors::shared::answer::{FinalAnswer, final_schema};
use crate::actors::shared::two_options;
use crate::topics::{AnswerLogprobs, EvidenceItem, EvidenceOrigin, Memory, Passage};

/// The label of QPaug's self-generated passage (paper 002).
pub const YOUR_KNOWLEDGE: &str = "Your knowledge";

/// Numbered `[i] title: text` lines, or "None".
pub fn documents<'a>(items: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let lines: Vec<String> =
        items.enumerate().map(|(i, (title, text))| format!("[{}] {title}: {text}", i + 1)).collect();
    if lines.is_empty() { "None".to_string() } else { lines.join("\n") }
}

/// One answer call over `documents` (the reader prompt), counted in the memory's usage and trace.
pub async fn read(
    llm: &LlmClient,
    memory: &mut Memory,
    stage: &str,
    purpose: &str,
    documents: &str,
) -> Result<FinalAnswer, StageError> {
    Ok(read_scored(llm, memory, stage, purpose, documents, false).await?.0)
}

/// [`read`], asking for the answer's token log-probabilities too when `logprobs` (None where the
/// server returns none).
pub async fn read_scored(
    llm: &LlmClient,
    memory: &mut Memory,
    stage: &str,
    purpose: &str,
    documents: &str,
    logprobs: bool,
) -> Result<(FinalAnswer, Option<AnswerLogprobs>), StageError> {
    let prompt =
        prompts::fill(prompts::READER, &[("documents", documents), ("question", &memory.question_to_answer())]);
    let reply = llm.structured_scored::<FinalAnswer>(prompts::SYSTEM, &prompt, &final_schema(), logprobs).await?;
    note_call(memory, stage, purpose, &reply.stats);
    Ok((reply.value, reply.stats.answer_logprobs))
}

/// [`read`], then with `compare_options` a two-option comparison settled in code over the same
/// documents (`two_options::settle`): the baselines' answer, and MIGRES's first read
/// (`migres.read_first`).
pub async fn read_settled(
    llm: &LlmClient,
    memory: &mut Memory,
    stage: &str,
    purpose: &str,
    documents: &str,
    compare_options: bool,
) -> Result<FinalAnswer, StageError> {
    Ok(read_settled_scored(llm, memory, stage, purpose, documents, (compare_options, false)).await?.0)
}

/// [`read_settled`], with the read's answer log-probabilities when `logprobs` (those of the words
/// the model wrote, before any comparison settled them).
pub async fn read_settled_scored(
    llm: &LlmClient,
    memory: &mut Memory,
    stage: &str,
    purpose: &str,
    documents: &str,
    (compare_options, logprobs): (bool, bool),
) -> Result<(FinalAnswer, Option<AnswerLogprobs>), StageError> {
    let (reading, scored) = read_scored(llm, memory, stage, purpose, documents, logprobs).await?;
    if !compare_options {
        return Ok((reading, scored));
    }
    let (answer, explanation) =
        two_options::settle(llm, memory, stage, documents, reading.answer, reading.explanation).await?;
    Ok((FinalAnswer { answer, explanation, ..reading }, scored))
}

/// The answer rests on what was shown: those passages (as shown) become its citations.
pub fn cite_shown<'a>(memory: &mut Memory, evidence: impl IntoIterator<Item = &'a EvidenceItem>) {
    for item in evidence.into_iter().filter(|e| e.origin == EvidenceOrigin::Passage) {
        let passage = Passage { id: item.id.clone(), title: item.title.clone(), text: item.text.clone() };
        memory.cited_passages.insert(item.id.clone(), passage);
    }
}
