//! The trace context between spans: a record carries the W3C `traceparent` of the span that published
//! it (https://www.w3.org/TR/trace-context/#traceparent-header), and the span that handles it is that
//! span's child. A question's first record gets the context of a short `question` span when it is
//! submitted, so a redelivered first event, like any other, lands in the question's one trace.

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer};
use opentelemetry::{Context, KeyValue};

/// The instrumentation scope of every span Lacuna makes.
pub const SCOPE: &str = "lacuna";

/// The tracer spans are made with: the installed provider's, or the no-op one.
pub fn tracer() -> opentelemetry::global::BoxedTracer {
    opentelemetry::global::tracer(SCOPE)
}

/// The `traceparent` of a span context; `None` for an invalid one (no-op spans without a parent).
pub fn format(context: &SpanContext) -> Option<String> {
    context
        .is_valid()
        .then(|| format!("00-{}-{}-{:02x}", context.trace_id(), context.span_id(), context.trace_flags().to_u8()))
}

/// A `traceparent` read as a remote span context; `None` when it is not one (ignored, as the
/// specification asks: the record starts a trace of its own).
pub fn parse(traceparent: &str) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four parts; later versions may add some, "ff" is forbidden.
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let hex = |text: &str, len: usize| {
        text.len() == len && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(version, 2) || !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8());
    let context = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    context.is_valid().then_some(context)
}

/// The context a record's span starts from: its publisher's, or none (a trace of its own).
pub fn parent_from(traceparent: Option<&str>) -> Context {
    match traceparent.and_then(parse) {
        Some(remote) => Context::new().with_remote_span_context(remote),
        None => Context::new(),
    }
}

/// A span named `name` under `parent`, started now; the context returned has it active. End it with
/// `context.span().end()` (or let the last clone of the context go).
pub fn child_span(name: impl Into<String>, kind: SpanKind, parent: &Context, attributes: Vec<KeyValue>) -> Context {
    let tracer = tracer();
    let span = tracer
        .span_builder(name.into())
        .with_kind(kind)
        .with_attributes(attributes)
        .start_with_context(&tracer, parent);
    parent.with_span(span)
}

/// The `traceparent` of the span active where this runs, to put on a record published from it.
pub fn current_traceparent() -> Option<String> {
    format(&Context::current().span().span_context().clone())
}

/// The trace id of the span active where this runs, for a record to name its trace.
pub fn current_trace_id() -> Option<String> {
    let context = Context::current();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| span_context.trace_id().to_string())
}

/// The context of a question's first record: a `question` span, the root of its trace (or a child
/// of `given`, the caller's own `traceparent`), ended at once. `None` when nothing traces and no
/// context was given.
pub fn question_traceparent(question_id: &str, given: Option<&str>) -> Option<String> {
    let parent = parent_from(given);
    let context = child_span(
        "question",
        SpanKind::Producer,
        &parent,
        vec![KeyValue::new("lacuna.question_id", question_id.to_string())],
    );
    let span = context.span();
    let traceparent = format(&span.span_context().clone());
    span.end();
    traceparent
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let context = parse(GIVEN).expect("the specification's example");
        assert!(context.is_sampled() && context.is_remote());
        assert_eq!(format(&context).as_deref(), Some(GIVEN));
    }

    #[test]
    fn malformed_traceparents_are_ignored_not_half_read() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(parse(bad).is_none(), "{bad:?} was read");
        }
        assert!(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later").is_some(), "a later version");
    }

    #[test]
    fn without_an_exporter_a_given_context_passes_through_unchanged() {
        // No provider is installed in unit tests: the no-op span keeps its parent's context.
        assert_eq!(question_traceparent("q1", Some(GIVEN)).as_deref(), Some(GIVEN));
        assert_eq!(question_traceparent("q1", None), None);
    }
}
