//! `evidence`: the top-k filtered passages (or sentences of them), sentence_filter -> leaf.

use serde::{Deserialize, Serialize};

use super::{Memory, Topic, memory_event};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceOrigin {
    Passage,
    /// Written by the LLM when no passage survived filtering (knowledge prompting, paper 4.5).
    ModelKnowledge,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvidenceItem {
    /// The passage id, or `knowledge-<iteration>` for model knowledge.
    pub id: String,
    pub title: String,
    /// What the leaf module is shown: the kept sentences in their original order, or the whole
    /// passage. The entailment check reads the same text (as the MIGRES code does).
    pub text: String,
    pub score: f32,
    pub origin: EvidenceOrigin,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvidenceEvent {
    pub schema_version: u32,
    pub memory: Memory,
    /// This iteration's queries: the leaf module extracts facts for them (not for the question).
    pub queries: Vec<String>,
    pub evidence: Vec<EvidenceItem>,
}

memory_event!(EvidenceEvent, Topic::Evidence);
