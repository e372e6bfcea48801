//! What the stages talk to: the LLM endpoint, the cross-encoder, the NLI check and the search index.
//!
//! - `llm`: the client of any OpenAI-compatible chat-completions endpoint, structured replies parsed.
//! - `call_stats`: what one LLM call spent (tokens, cost) and what it costs at a price.
//! - `value_logprobs`: the log-probabilities of one value of a JSON reply (the answer's words).
//! - `llm_cache`: LLM responses cached on disk, keyed by the hash of endpoint and request.
//! - `breaker`: a circuit breaker per LLM endpoint, so an outage waits on the bus, not in error records.
//! - `backoff`: how long a client waits before trying again: doubling with jitter, or jitter alone.
//! - `schema`: the JSON schema of an LLM reply, derived from the type it is parsed into.
//! - `attempt_spend`: what one attempt at an event spent on LLM calls, charged to the question when it
//!   fails.
//! - `onnx`: the text-pair classifier on ONNX Runtime (worker threads, batches) the next two share.
//! - `rerank`: the cross-encoder re-ranker, scoring (query, passage) pairs.
//! - `score_cache`: the re-ranker's scores kept on disk and read back (`rerank.cache`).
//! - `nli`: does a passage entail a fact: the LLM as a judge, or an ONNX NLI model.
//! - `gpu`: the provider ONNX sessions run on: CUDA when there is one, else the CPU, saying so.
//! - `search/`: the search index: tantivy BM25 on local disk or Meilisearch, read and written.

pub mod attempt_spend;
pub mod backoff;
pub mod breaker;
pub mod call_stats;
pub mod gpu;
pub mod llm;
pub mod llm_cache;
pub mod nli;
pub mod onnx;
pub mod rerank;
pub mod schema;
pub mod score_cache;
pub mod search;
pub mod value_logprobs;

pub use backoff::{backoff, jittered};
pub use call_stats::CallStats;
pub use llm::{Completion, LlmClient, LlmError};
pub use nli::{Nli, NliError, OnnxNli, Verdict};
pub use onnx::{ModelError, PairClassifier};
pub use rerank::Reranker;
pub use schema::Schema;
pub use search::{Document, DocumentError, MeiliSearch, Search, SearchError, TantivySearch, TantivyWriter};
