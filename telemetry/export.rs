//! Between ended spans and the backend: a bounded queue, and a thread of its own that sends them in
//! batches. Ending a span only tries to queue it, so a backend that is slow, down or refusing costs
//! the spans it cannot take, counted in `lacuna_trace_spans_dropped_total`, and never a question's
//! time. (The SDK's batch processor drops too, but does not say how many.)

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter as _, SpanProcessor};

use super::http_client::ReqwestClient;
use crate::config::{OtelProtocol, OtelSettings};
use crate::metrics::METRICS;

/// What the exporter is built from, on the export thread (tonic's channel needs its runtime).
pub(super) struct Exporter {
    pub(super) endpoint: String,
    pub(super) protocol: OtelProtocol,
    pub(super) headers: Vec<(String, String)>,
    pub(super) timeout: Duration,
    pub(super) resource: Resource,
}

impl Exporter {
    fn build(self) -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
        let mut exporter = match self.protocol {
            OtelProtocol::Http => {
                let url = format!("{}/v1/traces", self.endpoint.trim_end_matches('/'));
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_endpoint(url)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_timeout(self.timeout)
                    .with_http_client(ReqwestClient::new(self.timeout)?)
                    .with_headers(self.headers.into_iter().collect())
                    .build()?
            }
            OtelProtocol::Grpc => {
                use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
                let mut headers = HeaderMap::new();
                for (key, value) in self.headers {
                    // Neither is echoed: a value may be a secret.
                    let key = HeaderName::from_bytes(key.as_bytes())
                        .map_err(|_| anyhow::anyhow!("an OTLP header name is not a gRPC metadata key"))?;
                    let value = HeaderValue::from_str(&value)
                        .map_err(|_| anyhow::anyhow!("an OTLP header value is not ASCII"))?;
                    headers.insert(key, value);
                }
                let metadata = opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(headers);
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(self.endpoint)
                    .with_timeout(self.timeout)
                    .with_metadata(metadata)
                    .build()?
            }
        };
        exporter.set_resource(&self.resource);
        Ok(exporter)
    }
}

/// The queue's and batches' bounds (`[otel]`).
pub(super) struct Limits {
    queue_size: usize,
    batch_size: usize,
    interval: Duration,
    timeout: Duration,
}

impl Limits {
    pub(super) fn of(settings: &OtelSettings) -> Limits {
        Limits {
            queue_size: settings.queue_size.max(1),
            batch_size: settings.batch_size.max(1),
            interval: Duration::from_millis(settings.export_interval_ms.max(1)),
            timeout: Duration::from_millis(settings.export_timeout_ms.max(1)),
        }
    }
}

enum Message {
    Span(Box<SpanData>),
    /// Send what is queued, then say so.
    Flush(SyncSender<()>),
}

/// The span processor: queues ended spans for the export thread, or counts them dropped.
#[derive(Debug)]
pub(super) struct BoundedExport {
    queue: Mutex<Option<SyncSender<Message>>>,
    timeout: Duration,
}

impl BoundedExport {
    /// Builds the exporter on a new thread with a runtime of its own, and starts sending from there.
    pub(super) fn start(exporter: Exporter, limits: Limits) -> anyhow::Result<BoundedExport> {
        let (queue, spans) = sync_channel(limits.queue_size);
        let (built_tx, built) = sync_channel(1);
        let timeout = limits.timeout;
        std::thread::Builder::new().name("otel-export".into()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = built_tx.send(Err(anyhow::anyhow!("cannot start the export runtime: {error}")));
                    return;
                }
            };
            let exporter = {
                let _entered = runtime.enter();
                exporter.build()
            };
            match exporter {
                Ok(exporter) => {
                    let _ = built_tx.send(Ok(()));
                    send_batches(&runtime, exporter, spans, &limits);
                }
                Err(error) => {
                    let _ = built_tx.send(Err(error));
                }
            }
        })?;
        built.recv().map_err(|_| anyhow::anyhow!("the export thread ended before its exporter was built"))??;
        Ok(BoundedExport { queue: Mutex::new(Some(queue)), timeout })
    }

    fn flush(&self, wait: Duration) -> OTelSdkResult {
        let queue = self.queue.lock().unwrap().clone();
        let Some(queue) = queue else { return Err(OTelSdkError::AlreadyShutdown) };
        let (done_tx, done) = sync_channel(1);
        // Waits for room behind the queued spans: a flush is rare (shutdown) and bounded below.
        let deadline = Instant::now() + wait;
        let mut message = Message::Flush(done_tx);
        loop {
            match queue.try_send(message) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    message = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return Err(OTelSdkError::Timeout(wait)),
            }
        }
        done.recv_timeout(deadline.saturating_duration_since(Instant::now())).map_err(|_| OTelSdkError::Timeout(wait))
    }
}

impl SpanProcessor for BoundedExport {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let queue = self.queue.lock().unwrap();
        let sent = match queue.as_ref() {
            Some(queue) => queue.try_send(Message::Span(Box::new(span))).is_ok(),
            None => false,
        };
        if !sent {
            METRICS.trace_spans_dropped.with_label_values(&["queue_full"]).inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush(self.timeout * 2)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let flushed = self.flush(timeout.min(self.timeout));
        // Closing the queue ends the thread once it has sent what it holds. It is not waited for
        // past the flush: a backend that is down must not hold up a process that is stopping.
        self.queue.lock().unwrap().take();
        flushed
    }
}

/// The export thread: a batch goes out when full, when `interval` has passed since its first span,
/// on a flush, and when the queue closes. A batch that fails or passes `timeout` is dropped, counted.
fn send_batches(
    runtime: &tokio::runtime::Runtime,
    exporter: opentelemetry_otlp::SpanExporter,
    spans: Receiver<Message>,
    limits: &Limits,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(limits.batch_size);
    let mut due = Instant::now() + limits.interval;
    let send = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let count = batch.len() as u64;
        let spans = std::mem::take(batch);
        // The timeout is made inside the runtime: its timer needs one.
        let exported = runtime.block_on(async { tokio::time::timeout(limits.timeout, exporter.export(spans)).await });
        match exported {
            Ok(Ok(())) => METRICS.trace_spans_exported.with_label_values::<&str>(&[]).inc_by(count),
            failed => {
                METRICS.trace_spans_dropped.with_label_values(&["export_failed"]).inc_by(count);
                let error = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => format!("no answer within {} ms", limits.timeout.as_millis()),
                };
                tracing::warn!(spans = count, %error, "trace export failed: spans dropped");
            }
        }
    };
    loop {
        let wait = due.saturating_duration_since(Instant::now());
        match spans.recv_timeout(wait) {
            Ok(Message::Span(span)) => {
                if batch.is_empty() {
                    due = Instant::now() + limits.interval;
                }
                batch.push(*span);
                if batch.len() >= limits.batch_size {
                    send(&mut batch);
                }
            }
            Ok(Message::Flush(done)) => {
                send(&mut batch);
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {
                send(&mut batch);
                due = Instant::now() + limits.interval;
            }
            Err(RecvTimeoutError::Disconnected) => {
                send(&mut batch);
                break;
            }
        }
    }
    let _ = exporter.shutdown();
}
