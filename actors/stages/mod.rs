//! One file per stage, named after the stage (`main.rs` is MIGRES's main module). A stage is a type
//! implementing [`crate::actors::runner::Stage`]; which topics it reads and writes is declared in
//! its pipeline's file under `pipelines/`.
//!
//! MIGRES, round its loop:
//! - `retrieve`: BM25 top-n for each query of the iteration; a new question starts its memory here.
//! - `sentence_filter`: the re-ranker drops weak passages and keeps their relevant sentences, top k.
//! - `leaf`: the LLM distils facts from the shown evidence, each citing the passages that state it.
//! - `verify/`: keeps a fact only when a passage it cites entails it (the NLI check).
//! - `main`: answers from the verified facts, or names what is missing and goes round again.
//! - `query_gen`: up to 3 new single-hop queries for what is missing, none repeating an earlier one.
//!
//! The baselines and QPaug:
//! - `reader`: one LLM call answers from the filtered evidence (VANILLA; QPaug's answer step too).
//! - `augment`: QPaug's question augmentation, the retrieval query, and the model's own passage.
//!
//! RA-ISF:
//! - `self_knowledge`: answers from what the model knows, or sends the question to retrieval.
//! - `relevance`: judges each retrieved passage relevant or not; with none, on to `decompose`.
//! - `decompose`: splits a question into sub-questions (fan-out), or answers it at the depth limit.
//! - `compose`: answers a decomposed question from its sub-questions' answers.
//!
//! RQ-RAG:
//! - `refine`: one trajectory step: branch into refined queries, or at the limit go on to be answered.
//! - `trajectory_answer`: answers a trajectory from all it retrieved, keeping the log-probabilities.
//! - `select`: passes trajectories' answers up, and at the root chooses one.
//!
//! Both fan out and come back through `join`: it collects a parent's children's results (its state
//! kept in the compacted `join_state` topic) and hands them on, at the deadline with those that came.

pub mod augment;
pub mod compose;
pub mod decompose;
pub mod join;
pub mod leaf;
pub mod main;
pub mod query_gen;
pub mod reader;
pub mod refine;
pub mod relevance;
pub mod retrieve;
pub mod select;
pub mod self_knowledge;
pub mod sentence_filter;
pub mod trajectory_answer;
pub mod verify;
