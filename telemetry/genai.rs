//! The span of one LLM call, with OpenTelemetry's GenAI semantic conventions
//! (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/) and OpenInference's names for
//! the same figures, which LLM observability tools such as Phoenix read.

use opentelemetry::trace::{SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue, Value};

static RECORD_CONTENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether LLM spans carry prompt and completion text (`otel.record_content`, set by `init`).
pub fn record_content() -> bool {
    RECORD_CONTENT.load(std::sync::atomic::Ordering::Relaxed)
}

pub(super) fn set_record_content(on: bool) {
    RECORD_CONTENT.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// An LLM call's span, started under the span active where the call is made.
pub struct LlmSpan(Context);

/// What an LLM call came to, for its span.
#[derive(Default)]
pub struct LlmOutcome<'a> {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Prompt tokens the server took from its prefix cache, where it reports them.
    pub cached_tokens: u64,
    /// `stop`, or `length` for a reply cut at max_tokens.
    pub finish_reason: &'a str,
    pub reasks: u32,
    pub attempts: u32,
    pub cache_hit: bool,
    /// The endpoint's circuit breaker as the call ended (`closed`, `open`).
    pub breaker: &'a str,
    /// The reply, recorded only with `otel.record_content`.
    pub completion: Option<&'a str>,
}

impl LlmSpan {
    /// `model` at `server`, for `stage`; `prompt` is recorded only when given (`otel.record_content`).
    pub fn start(model: &str, server: &str, stage: &str, prompt: Option<String>) -> LlmSpan {
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", "openai"),
            KeyValue::new("gen_ai.request.model", model.to_string()),
            KeyValue::new("server.address", server.to_string()),
            KeyValue::new("lacuna.stage", stage.to_string()),
            KeyValue::new("openinference.span.kind", "LLM"),
            KeyValue::new("llm.model_name", model.to_string()),
        ];
        if let Some(prompt) = prompt {
            attributes.push(KeyValue::new("gen_ai.input.messages", prompt.clone()));
            attributes.push(KeyValue::new("input.value", prompt));
        }
        let context =
            super::context::child_span(format!("chat {model}"), SpanKind::Client, &Context::current(), attributes);
        LlmSpan(context)
    }

    /// Ends the span with what the call spent.
    pub fn end(self, outcome: LlmOutcome<'_>) {
        let span = self.0.span();
        let count = |n: u64| Value::I64(n.min(i64::MAX as u64) as i64);
        span.set_attributes([
            KeyValue::new("gen_ai.usage.input_tokens", count(outcome.input_tokens)),
            KeyValue::new("gen_ai.usage.output_tokens", count(outcome.output_tokens)),
            KeyValue::new("gen_ai.usage.cache_read.input_tokens", count(outcome.cached_tokens)),
            KeyValue::new("llm.token_count.prompt", count(outcome.input_tokens)),
            KeyValue::new("llm.token_count.completion", count(outcome.output_tokens)),
            KeyValue::new("llm.token_count.total", count(outcome.input_tokens + outcome.output_tokens)),
            KeyValue::new("lacuna.llm.reasks", i64::from(outcome.reasks)),
            KeyValue::new("lacuna.llm.attempts", i64::from(outcome.attempts)),
            KeyValue::new("lacuna.llm.cache_hit", outcome.cache_hit),
            KeyValue::new("lacuna.llm.breaker", outcome.breaker.to_string()),
        ]);
        if !outcome.finish_reason.is_empty() {
            let reasons = opentelemetry::Array::String(vec![outcome.finish_reason.to_string().into()]);
            span.set_attribute(KeyValue::new("gen_ai.response.finish_reasons", Value::Array(reasons)));
        }
        if let Some(completion) = outcome.completion {
            span.set_attribute(KeyValue::new("gen_ai.output.messages", completion.to_string()));
            span.set_attribute(KeyValue::new("output.value", completion.to_string()));
        }
        span.end();
    }

    /// Ends the span as failed, with the error's `error_type` (the record's) and message.
    pub fn fail(self, error_type: &'static str, message: String, breaker: &str, spent: (u64, u64)) {
        let span = self.0.span();
        span.set_attributes([
            KeyValue::new("error.type", error_type),
            KeyValue::new("lacuna.llm.breaker", breaker.to_string()),
            KeyValue::new("gen_ai.usage.input_tokens", spent.0.min(i64::MAX as u64) as i64),
            KeyValue::new("gen_ai.usage.output_tokens", spent.1.min(i64::MAX as u64) as i64),
        ]);
        span.set_status(Status::error(message));
        span.end();
    }
}
