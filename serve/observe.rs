//! The process's HTTP face for operators: `/metrics` (Prometheus text), `/healthz` (the process is
//! up) and `/readyz` (its bus and clients are ready), on axum like `lacuna serve`, which mounts the
//! same three routes. Also the listener both use: a connection must send its headers in time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::metrics::METRICS;

/// What one listener allows its clients.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// How long a connection may take to send a request's headers before it is closed.
    pub header_timeout: Duration,
    /// Open connections, at most; one past it is answered 503 and closed.
    pub max_connections: usize,
    /// The Retry-After of that 503, in seconds.
    pub retry_after_s: u64,
}

/// How long a connection may take to send a request's headers before it is closed.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// A stage process's endpoints: a few scrapers and probes, never hundreds of clients.
pub const OPERATOR_LIMITS: ConnectionLimits =
    ConnectionLimits { header_timeout: HEADER_TIMEOUT, max_connections: 64, retry_after_s: 1 };

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", tag = "operations", security(()), responses(
    (status = 200, description = "Every metric in the Prometheus text format (docs/metrics.md).",
        content_type = "text/plain", body = String),
))]
pub async fn metrics(State(ready): State<Arc<AtomicBool>>) -> Response {
    // Readiness as a series too, so an alert can see a process that is up but stuck.
    METRICS.ready.with_label_values::<&str>(&[]).set(ready.load(Ordering::Relaxed) as i64);
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], METRICS.render()).into_response()
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()), responses(
    (status = 200, description = "Up.", content_type = "text/plain", body = String),
))]
pub async fn healthz() -> Response {
    ([(CONTENT_TYPE, "text/plain")], "ok\n").into_response()
}

/// The pipelines or topics are ready.
#[utoipa::path(get, path = "/readyz", tag = "operations", security(()), responses(
    (status = 200, description = "Ready.", content_type = "text/plain", body = String),
    (status = 503, description = "Starting, or no longer able to work.", content_type = "text/plain", body = String),
))]
pub async fn readyz(State(ready): State<Arc<AtomicBool>>) -> Response {
    if ready.load(Ordering::Relaxed) {
        ([(CONTENT_TYPE, "text/plain")], "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, [(CONTENT_TYPE, "text/plain")], "starting\n").into_response()
    }
}

/// The three routes, `ready` turning `/readyz` green.
pub fn router(ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(ready)
}

/// Serves `router` on `listener` until the process ends, one task per connection. A connection
/// must send a request's whole header within `limits.header_timeout`, or it is closed: a client that
/// trickles its header cannot hold a connection for long. Past `limits.max_connections` open ones,
/// a new connection gets 503 with Retry-After and is closed, so slow clients cannot take every file
/// descriptor; its header is read under the same timeout.
pub fn serve_http(listener: TcpListener, router: Router, limits: ConnectionLimits) {
    let service = hyper_util::service::TowerToHyperService::new(router);
    let overloaded = hyper_util::service::TowerToHyperService::new(
        Router::new().fallback(move || async move { overloaded_reply(limits.retry_after_s) }),
    );
    let open = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, typically: wait rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let permit = open.clone().try_acquire_owned().ok();
            let (service, overloaded) = (service.clone(), overloaded.clone());
            tokio::spawn(async move {
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(limits.header_timeout);
                let io = hyper_util::rt::TokioIo::new(stream);
                let outcome = match permit {
                    Some(_permit) => builder.serve_connection(io, service).await,
                    None => builder.keep_alive(false).serve_connection(io, overloaded).await,
                };
                if let Err(error) = outcome {
                    tracing::debug!(%error, "connection ended with an error");
                }
            });
        }
    });
}

/// The reply to a connection past the cap: the API's own error, counted under its own reason.
fn overloaded_reply(retry_after_s: u64) -> Response {
    use super::http::{ApiError, ErrorCode};
    let message = "too many open connections; retry later";
    let refused = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, message);
    ApiError { reason: "too_many_connections", retry_after: Some(retry_after_s), ..refused }.into_response()
}

/// Serves the endpoints on `listen` until the process ends; returns the bound address.
pub async fn serve(listen: &str, ready: Arc<AtomicBool>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let address = listener.local_addr()?;
    serve_http(listener, router(ready), OPERATOR_LIMITS);
    Ok(address)
}

/// Starts the endpoints when `metrics.listen` is set; the returned flag turns `/readyz` green.
pub async fn start(listen: &str) -> anyhow::Result<Arc<AtomicBool>> {
    let ready = Arc::new(AtomicBool::new(false));
    if !listen.is_empty() {
        let address =
            serve(listen, ready.clone()).await.map_err(|e| anyhow::anyhow!("metrics.listen {listen}: {e}"))?;
        tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    }
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A client that sends half a request header and then nothing is disconnected once the header
    /// timeout passed (30 s in service; shorter here, through the same listener code).
    #[tokio::test]
    async fn a_connection_whose_header_never_completes_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let limits = ConnectionLimits { header_timeout: Duration::from_millis(300), ..OPERATOR_LIMITS };
        serve_http(listener, router(Arc::new(AtomicBool::new(true))), limits);
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the connection was still open after 10 s");
        let reply = String::from_utf8_lossy(&rest);
        assert!(!reply.contains("200 OK"), "a request without its blank line was answered: {reply}");
    }
}
