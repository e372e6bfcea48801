//! What a stage writes into the question's usage and trace besides its own steps: each LLM call
//! (tokens, latency, cost), and a step that went on without what it asked for (degraded).

use crate::actors::clients::CallStats;

use crate::topics::{Memory, TraceKind};

/// Records that `stage` went on without what it asked for, in the trace (and so in the record's
/// `degraded` list) and in metrics.
pub fn degrade(memory: &mut Memory, stage: &str, cause: &str, message: String) {
    crate::metrics::METRICS.degraded.with_label_values(&[stage]).inc();
    tracing::warn!(stage, cause, %message, "degraded instead of failing the question");
    memory.record(stage, TraceKind::Degraded { cause: cause.to_string(), message });
}

/// Adds one LLM call to the question's usage and trace; a reply kept though cut at `max_tokens` is
/// a degraded step.
pub fn note_call(memory: &mut Memory, stage: &str, purpose: &str, stats: &CallStats) {
    memory.usage.llm_calls += 1;
    memory.usage.prompt_tokens += stats.prompt_tokens;
    memory.usage.completion_tokens += stats.completion_tokens;
    memory.usage.cached_tokens += stats.cached_tokens;
    memory.usage.cache_hits += u32::from(stats.cache_hit);
    if stats.cost > 0.0 {
        memory.usage.cost += stats.cost;
        // A fanned-out child's `stage@1.2` counts as `stage`.
        let own = stage.split('@').next().unwrap_or(stage);
        *memory.usage.cost_by_stage.entry(own.to_string()).or_default() += stats.cost;
        crate::metrics::METRICS.llm_cost.with_label_values(&[own]).inc_by(stats.cost);
    }
    memory.record(
        stage,
        TraceKind::LlmCall {
            purpose: purpose.to_string(),
            prompt_tokens: stats.prompt_tokens,
            completion_tokens: stats.completion_tokens,
            cached_tokens: stats.cached_tokens,
            latency_ms: stats.latency_ms,
            attempts: stats.attempts,
            reasks: stats.reasks,
        },
    );
    if stats.truncated {
        degrade(
            memory,
            stage,
            "cut_at_max_tokens",
            format!("the {purpose} reply stopped at max_tokens and is used as cut"),
        );
    }
}
