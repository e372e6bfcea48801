//! Traces: every question one OpenTelemetry trace, however many processes and replicas it crosses,
//! exported over OTLP to whatever backend the platform runs (Tempo, Jaeger, Honeycomb, Phoenix).
//!
//! - `context`: the W3C `traceparent` and `tracestate` a record carries from the span that published
//!   it to the span that handles it (Kafka headers, in-process fields), and the spans made from them.
//! - `export`: a bounded queue and a thread of its own between ended spans and the exporter, so that
//!   a slow or absent backend costs dropped spans (counted), never a slower question.
//! - `http_client`: OTLP/HTTP through our reqwest.
//! - `genai`: the attributes of LLM calls (OpenTelemetry's GenAI conventions).
//! - `exit`: what must end before the process does when it leaves early (a failed Kafka
//!   transaction), and on its way out of `main`.
//!
//! With no endpoint nothing is installed: spans are OpenTelemetry's no-op ones, which cost nothing
//! and pass an incoming trace context on unchanged.

pub mod context;
pub mod exit;
mod export;
pub mod genai;
mod http_client;

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

pub use context::{
    SCOPE, TraceHeaders, child_span, current_headers, current_trace_id, linked_span, question_headers, record_parent,
    tracer,
};

use crate::config::OtelSettings;

/// Installed traces: flushed and shut down when dropped, so a process that ends sends what it has.
pub struct Traces {
    provider: SdkTracerProvider,
}

/// The installed provider, for [`exit`] to flush: a process that exits early has no [`Traces`] to
/// drop.
static INSTALLED: std::sync::Mutex<Option<SdkTracerProvider>> = std::sync::Mutex::new(None);

/// Sends the spans queued so far, waiting up to twice `otel.export_timeout_ms`.
fn flush_installed() {
    let installed = INSTALLED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    if let Some(Err(error)) = installed.map(|provider| provider.force_flush()) {
        tracing::debug!(%error, "trace export flush at exit failed");
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        INSTALLED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        // Bounded by the export thread's own timeout; a backend that is down loses these spans.
        if let Err(error) = self.provider.shutdown() {
            tracing::debug!(%error, "trace export shut down with an error");
        }
    }
}

/// The endpoint traces go to: `otel.endpoint`, else `OTEL_EXPORTER_OTLP_ENDPOINT`, else none.
pub fn endpoint(settings: &OtelSettings) -> Option<String> {
    let configured = Some(settings.endpoint.trim().to_string()).filter(|e| !e.is_empty());
    configured.or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok().filter(|e| !e.trim().is_empty()))
}

/// Installs the exporter when an endpoint is set; `process` names what runs (`stage`, `serve`, ...)
/// in the resource. `None`: traces are off.
pub fn init(settings: &OtelSettings, process: &str) -> anyhow::Result<Option<Traces>> {
    let Some(endpoint) = endpoint(settings) else { return Ok(None) };
    if !(0.0..=1.0).contains(&settings.sampling_ratio) {
        anyhow::bail!("otel.sampling_ratio must be within 0 and 1, not {}", settings.sampling_ratio);
    }
    let headers = headers(settings)?;
    let resource = resource(settings, process);
    let exporter = export::Exporter {
        endpoint: endpoint.clone(),
        protocol: settings.protocol,
        headers,
        timeout: Duration::from_millis(settings.export_timeout_ms),
        resource: resource.clone(),
    };
    let processor = export::BoundedExport::start(exporter, export::Limits::of(settings))
        .with_context(|| format!("starting the trace export to {endpoint}"))?;
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sampling_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    *INSTALLED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(provider.clone());
    exit::at_exit("trace export", flush_installed);
    genai::set_record_content(settings.record_content);
    tracing::info!(%endpoint, protocol = ?settings.protocol, ratio = settings.sampling_ratio, "exporting traces");
    Ok(Some(Traces { provider }))
}

/// Back to no traces (the no-op provider), after [`Traces`] was dropped: for a process that
/// compares runs with and without them (`lacuna bench pipeline --against-traces`).
pub fn uninstall() {
    opentelemetry::global::set_tracer_provider(opentelemetry::trace::noop::NoopTracerProvider::new());
}

/// Spans exported and dropped by this process so far (`lacuna_trace_spans_*_total`).
pub fn export_counts() -> (u64, u64) {
    let m = &crate::metrics::METRICS;
    let exported = m.trace_spans_exported.with_label_values::<&str>(&[]).get();
    let dropped =
        ["queue_full", "export_failed"].iter().map(|r| m.trace_spans_dropped.with_label_values(&[r]).get()).sum();
    (exported, dropped)
}

/// `service.name` lacuna; `service.instance.id` this replica (the pod's host name and the process);
/// `lacuna.process` the command; then the configured attributes.
fn resource(settings: &OtelSettings, process: &str) -> Resource {
    let mut attributes = vec![
        KeyValue::new("service.instance.id", replica()),
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("lacuna.process", process.to_string()),
    ];
    attributes.extend(settings.resource_attributes.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
    Resource::builder().with_service_name("lacuna").with_attributes(attributes).build()
}

/// This process among the replicas: `HOSTNAME` (a pod's name) and the process id.
pub fn replica() -> String {
    static REPLICA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    REPLICA
        .get_or_init(|| {
            let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "localhost".into());
            format!("{host}-{}", std::process::id())
        })
        .clone()
}

/// The exporter's headers from the variable `otel.headers_env` names, in OTLP's
/// `key=value,key2=value2` form (values kept as given: no percent-decoding).
fn headers(settings: &OtelSettings) -> anyhow::Result<Vec<(String, String)>> {
    if settings.headers_env.is_empty() {
        return Ok(Vec::new());
    }
    let Ok(text) = std::env::var(&settings.headers_env) else { return Ok(Vec::new()) };
    parse_headers(&text).with_context(|| format!("the OTLP headers in {}", settings.headers_env))
}

pub fn parse_headers(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_string(), value.trim().to_string())),
            // The pair itself is not echoed: it may hold a secret.
            _ => anyhow::bail!("a header is not key=value"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_in_otlp_form_without_echoing_a_bad_one() {
        let parsed = parse_headers("api_key=abc, x-tenant = t1 ,").unwrap();
        assert_eq!(parsed, vec![("api_key".into(), "abc".into()), ("x-tenant".into(), "t1".into())]);
        let error = parse_headers("Authorization: Bearer s3cret").unwrap_err();
        assert!(!format!("{error:#}").contains("s3cret"), "{error:#}");
    }
}
