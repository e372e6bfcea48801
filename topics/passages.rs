//! `passages`: BM25 hits for each query of this iteration, retrieve -> sentence_filter.

use serde::{Deserialize, Serialize};

use super::{Memory, Passage, Topic, memory_event};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetrievedPassage {
    /// The query that found it: the re-ranker scores the passage against this query.
    pub query: String,
    pub passage: Passage,
    pub bm25: f32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PassagesEvent {
    pub schema_version: u32,
    pub memory: Memory,
    /// The queries of this iteration (hits may be empty when every passage is used up).
    pub queries: Vec<String>,
    pub hits: Vec<RetrievedPassage>,
}

memory_event!(PassagesEvent, Topic::Passages);
