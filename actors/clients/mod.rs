//! What the stages talk to: the LLM endpoint, the cross-encoder, the NLI check and the search index.

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
pub mod search;

pub use backoff::{backoff, jittered};
pub use call_stats::CallStats;
pub use llm::{Completion, LlmClient, LlmError};
pub use nli::{Nli, NliError, OnnxNli, Verdict};
pub use onnx::{ModelError, PairClassifier};
pub use rerank::Reranker;
pub use schema::Schema;
pub use search::{Document, DocumentError, MeiliSearch, Search, SearchError, TantivySearch, TantivyWriter};
