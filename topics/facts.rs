//! `facts`: facts the leaf module extracted, each citing evidence ids, leaf -> verify.

use serde::{Deserialize, Serialize};

use super::{EvidenceItem, Memory, Topic, memory_event};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateFact {
    pub text: String,
    /// Evidence ids (passage ids or `knowledge-<iteration>`) the fact claims to come from.
    pub citations: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FactsEvent {
    pub schema_version: u32,
    pub memory: Memory,
    /// Carried along so verify can read the cited passages without a lookup.
    pub evidence: Vec<EvidenceItem>,
    pub facts: Vec<CandidateFact>,
}

memory_event!(FactsEvent, Topic::Facts);
