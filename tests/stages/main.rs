//! One module per stage, each driving the stage with hand-made events and checking what it emits.
//! Real parts where they matter: the tantivy index of the HotpotQA corpus, the ONNX cross-encoder, and
//! an OpenAI-protocol fake LLM over HTTP.

#[path = "../support/mod.rs"]
mod support;

mod helpers;
mod leaf;
mod llm_client;
mod main_module;
mod memory_rules;
mod query_gen;
mod reranker;
mod retrieve;
mod sentence_filter;
mod stage_runner;
mod verify;
