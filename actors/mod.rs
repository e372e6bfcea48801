//! The stages of the MIGRES loop, one file each, and the clients they use:
//!
//! questions -> retrieve -> sentence_filter -> leaf -> verify -> main -> answers
//!                 ^                                                |
//!                 +---------- query_gen <- missing <---------------+

pub mod augment;
pub mod clients;
pub mod compose;
pub mod join;
pub mod leaf;
pub mod main;
pub mod prompts;
pub mod query_gen;
pub mod reader;
pub mod refine;
pub mod relevance;
pub mod retrieve;
pub mod select;
pub mod self_knowledge;
pub mod sentence_filter;
pub mod stage;
pub mod verify;

use clients::CallStats;

use crate::topics::{Memory, TraceKind};

/// Adds one LLM call to the question's usage and trace.
pub fn note_call(memory: &mut Memory, stage: &str, purpose: &str, stats: &CallStats) {
    memory.usage.llm_calls += 1;
    memory.usage.prompt_tokens += stats.prompt_tokens;
    memory.usage.completion_tokens += stats.completion_tokens;
    memory.usage.cached_tokens += stats.cached_tokens;
    memory.usage.cache_hits += u32::from(stats.cache_hit);
    memory.record(
        stage,
        TraceKind::LlmCall {
            purpose: purpose.to_string(),
            prompt_tokens: stats.prompt_tokens,
            completion_tokens: stats.completion_tokens,
            cached_tokens: stats.cached_tokens,
            latency_ms: stats.latency_ms,
            attempts: stats.attempts,
        },
    );
}
