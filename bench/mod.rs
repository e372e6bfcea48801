//! `lacuna bench`: where a pipeline's time goes, and how fast the re-ranker scores, as figures and
//! ratios (not timed tests). `fake_llm` stands in for a fast LLM server so our own costs show.
//!
//! - `pipeline`: a pipeline run in process: questions/s, LLM calls in flight, busy time per stage.
//! - `rerank`: the same pairs scored three ways (arrival order, length-sorted, the stage's own path).
//! - `freshness`: how soon an ingested document is searchable on every replica while questions run.
//! - `replica`: a retrieve replica or indexer process following the documents topic, and its readiness.
//! - `fake_llm`: an OpenAI-compatible server answering schema-valid replies after a set latency.

pub mod fake_llm;
pub mod freshness;
pub mod pipeline;
pub mod replica;
pub mod rerank;
