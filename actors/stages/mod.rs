//! One file per stage, named after the stage (`main.rs` is MIGRES's main module). A stage is a type
//! implementing [`crate::actors::runner::Stage`]; which topics it reads and writes is declared in
//! its pipeline's file under `pipelines/`.

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
