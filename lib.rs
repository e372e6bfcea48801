//! Lacuna answers streams of hard questions by finding what is missing and going to get it: the
//! MIGRES method (and its sibling methods) as a dataflow of actors exchanging events over a bus.
//!
//! Layout (a map of the architecture), each layer using only those below it, in this order:
//! `metrics`, `config` < `telemetry` < `topics` < `actors` < `pipelines` < `eval` < `bench` < `serve` < `cli`
//! (`tests/topology.rs` checks it, and that no files of a folder import each other in a circle):
//! - `config/`: `default.toml` and the typed settings, one file per group of sections, and the
//!   evaluation profiles (`paper`).
//! - `telemetry/`: OpenTelemetry traces: the trace context records carry, the spans of LLM calls,
//!   the bounded export over OTLP, and what ends before a process that exits early does (`exit`).
//! - `topics/`: the event of each topic, the question's memory and trace, the bus trait, the
//!   in-process bus, and the Kafka bus (`topics/kafka/`).
//! - `actors/`: `stages/`, one file per stage (retrieve, sentence_filter, leaf, verify, main,
//!   query_gen, reader, augment, self_knowledge, relevance, decompose, join, compose, refine,
//!   trajectory_answer, select); `runner/`, the generic stage runner (bus, bounded work in flight,
//!   retries, acks, error records), which imports no stage; `shared/`, what several stages use;
//!   `prompts/`; and `clients/` for the LLM, re-ranker, NLI and search index.
//! - `pipelines/`: one file per pipeline declaring its stages (`migres.rs`, `vanilla.rs`, `qpaug.rs`,
//!   `raisf.rs`, `rqrag.rs`), what a declaration is (`declaration.rs`), the topology read off it
//!   (`graph.rs`, drawn by `render.rs`), what a process loads before its first question
//!   (`startup.rs`), and the runner of a whole pipeline in one process (`runner.rs`).
//! - `eval/`: `lacuna eval`, `lacuna calibrate` and `lacuna recall`: scoring, reports, comparisons.
//! - `bench/`: `lacuna bench`: a pipeline's throughput and the re-ranker's speed, with a fake LLM.
//! - `serve/`: `lacuna serve` on axum: the handlers, their bodies, the OpenAPI document built from
//!   them, the registry of questions and their event streams, the live page, and every process's
//!   operator endpoints (`observe.rs`: `/metrics`, `/healthz`, `/readyz`).
//! - `cli/`: the `lacuna` command line on top of all of them.
//! - `metrics.rs`: every metric's name.

pub mod actors;
pub mod bench;
pub mod cli;
pub mod config;
pub mod eval;
pub mod metrics;
pub mod pipelines;
pub mod serve;
pub mod telemetry;
pub mod topics;
