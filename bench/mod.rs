//! `lacuna bench`: where a pipeline's time goes, and how fast the re-ranker scores, as figures and
//! ratios (not timed tests). `fake_llm` stands in for a fast LLM server so our own costs show.

pub mod fake_llm;
pub mod freshness;
pub mod pipeline;
pub mod replica;
pub mod rerank;
