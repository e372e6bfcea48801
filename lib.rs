//! Lacuna answers streams of hard questions by finding what is missing and going to get it: the
//! MIGRES method as a dataflow of actors exchanging events over a bus.
//!
//! Layout (a map of the architecture):
//! - `topics/`: the event of each topic, the question's memory and trace, the bus trait and the
//!   in-process bus.
//! - `actors/`: one file per stage (retrieve, sentence_filter, leaf, verify, main, query_gen), the
//!   stage runner, the prompts, and `clients/` for the LLM, re-ranker, NLI and search index.
//! - `pipelines/`: which stages a pipeline runs and how (`migres.rs`, `vanilla.rs`, `pipeline.rs`),
//!   and the `lacuna` binary.
//! - `config/`: `default.toml` and the typed settings.
//! - `eval/`: `lacuna eval` and `lacuna calibrate`: scoring, reports, comparisons.

pub mod actors;
pub mod eval;
pub mod metrics;
pub mod pipelines;
#[path = "config/settings.rs"]
pub mod settings;
pub mod topics;
