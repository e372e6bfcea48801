//! The stages, the runner that feeds them from the bus, what several stages share, and the clients
//! they use.
//!
//! - `stages/`: one file per stage, named after it. MIGRES: retrieve -> sentence_filter -> leaf ->
//!   verify -> main -> answers, and main -> query_gen -> retrieve for the next iteration. The
//!   baselines and QPaug: `reader` (and `augment`); RA-ISF: `self_knowledge`, `relevance`,
//!   `decompose`, `compose`; RQ-RAG: `refine`, `select`; both fan out and come back through `join`.
//! - `runner/`: the generic stage runner (bus, bounded work in flight, retries, acks, error records
//!   and dead letters), and the per-key order and de-duplication it keeps. It imports no stage.
//! - `shared/`: what several stages use: final answers and records (`answer`), fan-out records and
//!   node paths (`fanout`), documents shown to the LLM and citations (`evidence`), choosing among
//!   candidate answers (`selection`), two-option questions settled in code (`two_options`), answers
//!   spelled as the evidence writes them (`span`), and LLM calls and degraded steps in the trace
//!   (`accounting`).
//! - `prompts/`: the prompt templates, one text file each.
//! - `clients/`: the LLM (with its cache, circuit breaker and backoff), the re-ranker, the NLI
//!   model and the search index.
//!
//! Which stage reads and writes which topic is declared per pipeline in `pipelines/`.

pub mod clients;
pub mod prompts;
pub mod runner;
pub mod shared;
pub mod stages;
