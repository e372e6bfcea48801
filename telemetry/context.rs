//! The trace context between spans. A record carries the W3C headers
//! (https://www.w3.org/TR/trace-context/) of the span that published it: `traceparent` names that
//! span, and `tracestate` holds, under the key `lacuna`, the span id of its question's root (the
//! `question` span made when it was submitted). The span that handles the record is a child of that
//! root, with a link to the span that published it, so a question's trace reads as one flat
//! timeline of its stages, however many rounds its loop takes (a chain of 30 nested spans is
//! unreadable in any backend's tree), while every causal step stays one click away.

use std::str::FromStr;

use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
};
use opentelemetry::{Context, KeyValue};

/// The instrumentation scope of every span Lacuna makes.
pub const SCOPE: &str = "lacuna";

/// The `tracestate` key under which a question's root span id travels.
const ROOT_KEY: &str = "lacuna";

/// The tracer spans are made with: the installed provider's, or the no-op one.
pub fn tracer() -> opentelemetry::global::BoxedTracer {
    opentelemetry::global::tracer(SCOPE)
}

/// What a record carries of its question's trace (Kafka: headers of these names).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceHeaders {
    /// The span that published the record; `None` where nothing traces.
    pub traceparent: Option<String>,
    /// Its trace state: `lacuna=<root span id>` and whatever a caller's tracer put there.
    pub tracestate: Option<String>,
}

impl TraceHeaders {
    /// The headers of a span context; empty for an invalid one (a no-op span without a parent).
    pub fn of(context: &SpanContext) -> TraceHeaders {
        if !context.is_valid() {
            return TraceHeaders::default();
        }
        let traceparent =
            format!("00-{}-{}-{:02x}", context.trace_id(), context.span_id(), context.trace_flags().to_u8());
        let state = context.trace_state().header();
        TraceHeaders { traceparent: Some(traceparent), tracestate: (!state.is_empty()).then_some(state) }
    }

    pub fn is_empty(&self) -> bool {
        self.traceparent.is_none()
    }

    /// The span context they name; `None` when `traceparent` is absent or not one (ignored, as the
    /// specification asks). A malformed `tracestate` is dropped, the `traceparent` kept.
    pub fn span_context(&self) -> Option<SpanContext> {
        let (trace_id, span_id, flags) = parse_traceparent(self.traceparent.as_deref()?)?;
        let state = self.tracestate.as_deref().and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
        let context = SpanContext::new(trace_id, span_id, flags, true, state);
        context.is_valid().then_some(context)
    }
}

fn parse_traceparent(traceparent: &str) -> Option<(TraceId, SpanId, TraceFlags)> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace_id, span_id, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four parts; later versions may add some, "ff" is forbidden.
    if version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let hex = |text: &str, len: usize| {
        text.len() == len && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(version, 2) || !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8());
    Some((TraceId::from_hex(trace_id).ok()?, SpanId::from_hex(span_id).ok()?, flags))
}

/// Where the span handling a record starts: under its question's root, linked to the span that
/// published it; under that span when the record names no root (a producer of another make); a
/// trace of its own when it carries nothing.
pub fn record_parent(headers: &TraceHeaders) -> (Context, Vec<Link>) {
    let Some(producer) = headers.span_context() else { return (Context::new(), Vec::new()) };
    let root = producer.trace_state().get(ROOT_KEY).and_then(|id| SpanId::from_hex(id).ok());
    match root.filter(|id| *id != SpanId::INVALID && *id != producer.span_id()) {
        Some(root) => {
            let state = producer.trace_state().clone();
            let parent = SpanContext::new(producer.trace_id(), root, producer.trace_flags(), true, state);
            (Context::new().with_remote_span_context(parent), vec![Link::with_context(producer)])
        }
        None => (Context::new().with_remote_span_context(producer), Vec::new()),
    }
}

/// A span named `name` under `parent`, started now; the context returned has it active. End it with
/// `context.span().end()` (or let the last clone of the context go).
pub fn child_span(name: impl Into<String>, kind: SpanKind, parent: &Context, attributes: Vec<KeyValue>) -> Context {
    linked_span(name, kind, parent, Vec::new(), attributes)
}

/// [`child_span`], with links to other spans.
pub fn linked_span(
    name: impl Into<String>,
    kind: SpanKind,
    parent: &Context,
    links: Vec<Link>,
    attributes: Vec<KeyValue>,
) -> Context {
    let tracer = tracer();
    let builder = tracer.span_builder(name.into()).with_kind(kind).with_attributes(attributes);
    let builder = if links.is_empty() { builder } else { builder.with_links(links) };
    parent.with_span(builder.start_with_context(&tracer, parent))
}

/// The headers for a record published where this runs: the active span's.
pub fn current_headers() -> TraceHeaders {
    TraceHeaders::of(&Context::current().span().span_context().clone())
}

/// The trace id of the span active where this runs, for a record to name its trace.
pub fn current_trace_id() -> Option<String> {
    let context = Context::current();
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| span_context.trace_id().to_string())
}

/// The headers of a question's first record: a `question` span, the root of its trace (or a child
/// of `given`, the caller's own `traceparent`), ended at once, its id kept in the `tracestate` for
/// every span of the question to hang from. Empty when nothing traces and no context was given.
pub fn question_headers(question_id: &str, given: Option<&str>) -> TraceHeaders {
    let given = TraceHeaders { traceparent: given.map(str::to_string), tracestate: None };
    let parent = match given.span_context() {
        Some(caller) => Context::new().with_remote_span_context(caller),
        None => Context::new(),
    };
    let attributes = vec![KeyValue::new("lacuna.question_id", question_id.to_string())];
    let context = child_span("question", SpanKind::Producer, &parent, attributes);
    let span = context.span();
    let root = span.span_context().clone();
    span.end();
    if !root.is_valid() {
        return TraceHeaders::default();
    }
    // Untraced here, the caller's context passes on unchanged: it is not our root to name.
    if given.span_context().is_some_and(|caller| caller.span_id() == root.span_id()) {
        return TraceHeaders::of(&root);
    }
    let state = root.trace_state().insert(ROOT_KEY, root.span_id().to_string()).unwrap_or_default();
    let rooted = SpanContext::new(root.trace_id(), root.span_id(), root.trace_flags(), true, state);
    TraceHeaders::of(&rooted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(traceparent: &str, tracestate: Option<&str>) -> TraceHeaders {
        TraceHeaders { traceparent: Some(traceparent.into()), tracestate: tracestate.map(str::to_string) }
    }

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let context = headers(GIVEN, None).span_context().expect("the specification's example");
        assert!(context.is_sampled() && context.is_remote());
        assert_eq!(TraceHeaders::of(&context), headers(GIVEN, None));
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
            assert!(headers(bad, None).span_context().is_none(), "{bad:?} was read");
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later";
        assert!(headers(later, None).span_context().is_some(), "a later version");
    }

    #[test]
    fn a_record_hangs_under_its_question_root_linked_to_its_publisher() {
        let (parent, links) = record_parent(&headers(GIVEN, Some("lacuna=1111111111111111,other=x")));
        let parent = parent.span().span_context().clone();
        assert_eq!(parent.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent.span_id().to_string(), "1111111111111111", "the root");
        assert_eq!(links.len(), 1);
        assert_eq!(links[0].span_context.span_id().to_string(), "00f067aa0ba902b7", "the publisher");

        let (parent, links) = record_parent(&headers(GIVEN, Some("other=x")));
        assert_eq!(parent.span().span_context().span_id().to_string(), "00f067aa0ba902b7", "no root: the publisher");
        assert!(links.is_empty());
        let (parent, _) = record_parent(&TraceHeaders::default());
        assert!(!parent.has_active_span(), "nothing carried: a trace of its own");
    }

    #[test]
    fn without_an_exporter_a_given_context_passes_through_unchanged() {
        // No provider is installed in unit tests: the no-op span keeps its parent's context.
        assert_eq!(question_headers("q1", Some(GIVEN)), headers(GIVEN, None));
        assert!(question_headers("q1", None).is_empty());
    }
}
