//! `evidence`: the top-k filtered passages (or sentences of them), sentence_filter -> leaf.

use serde::{Deserialize, Serialize};

use super::{EvidenceItem, Memory, Topic, memory_event};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvidenceEvent {
    pub schema_version: u32,
    pub memory: Memory,
    /// This iteration's queries: the leaf module extracts facts for them (not for the question).
    pub queries: Vec<String>,
    pub evidence: Vec<EvidenceItem>,
}

memory_event!(EvidenceEvent, Topic::Evidence);
