//! Lacuna answers streams of hard questions by finding what is missing and going to get it: the
//! MIGRES method (and its sibling methods) as a dataflow of actors exchanging events over a bus.
//!
//! Layout (a map of the architecture), each layer using only those below it:
//! - `topics/`: the event of each topic, the question's memory and trace, the bus trait, the
//!   in-process and Kafka buses.
//! - `actors/`: one file per stage (retrieve, sentence_filter, leaf, verify, main_module, query_gen,
//!   reader, augment, self_knowledge, relevance, join, compose, refine, select), the generic stage
//!   runner (`stage.rs`), what several stages share (`answer.rs`, `fanout.rs`, `evidence.rs`,
//!   `selection.rs`), the prompts, and `clients/` for the LLM, re-ranker, NLI and search index.
//! - `pipelines/`: one file per pipeline declaring its stages (`migres.rs`, `vanilla.rs`, `qpaug.rs`,
//!   `raisf.rs`, `rqrag.rs`), what a declaration is (`declaration.rs`), the topology read off it
//!   (`graph.rs`), and the runner of a whole pipeline in one process (`runner.rs`).
//! - `eval/`: `lacuna eval`, `lacuna calibrate` and `lacuna recall`: scoring, reports, comparisons.
//! - `bench/`: `lacuna bench`: a pipeline's throughput and the re-ranker's speed, with a fake LLM.
//! - `serve/`: `lacuna serve`: the HTTP API, its Server-Sent Events and the live page.
//! - `cli/`: the `lacuna` command line on top of all of them.
//! - `config/`: `default.toml`, the typed settings, and the evaluation profiles (`paper`);
//!   `metrics.rs`: every metric's name.

pub mod actors;
pub mod bench;
pub mod cli;
pub mod config;
pub mod eval;
pub mod metrics;
pub mod pipelines;
pub mod serve;
pub mod topics;
