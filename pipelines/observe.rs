//! The process's HTTP face for operators: `/metrics` (Prometheus text), `/healthz` (the process is
//! up) and `/readyz` (its bus and clients are ready). A few lines of HTTP/1.1 on tokio: the three
//! routes do not justify a web framework in the dependency tree.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::metrics::METRICS;

/// Serves the endpoints on `listen` until the process ends; returns the bound address.
pub async fn serve(listen: &str, ready: Arc<AtomicBool>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen).await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { continue };
            let ready = ready.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let Ok(n) = socket.read(&mut request).await else { return };
                let path = std::str::from_utf8(&request[..n])
                    .ok()
                    .and_then(|r| r.split_whitespace().nth(1))
                    .unwrap_or("/")
                    .to_string();
                let (status, content_type, body) = respond(&path, &ready)
                    .unwrap_or_else(|| ("404 Not Found", "text/plain", "not found\n".to_string()));
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(body.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    Ok(address)
}

/// The reply to one of the operator routes (status line, content type, body); `None` for other paths.
/// `lacuna serve` answers them on its own port with this.
pub fn respond(path: &str, ready: &AtomicBool) -> Option<(&'static str, &'static str, String)> {
    Some(match path {
        "/metrics" => {
            // Readiness as a series too, so an alert can see a process that is up but stuck.
            METRICS.ready.with_label_values::<&str>(&[]).set(ready.load(Ordering::Relaxed) as i64);
            ("200 OK", "text/plain; version=0.0.4", METRICS.render())
        }
        "/healthz" => ("200 OK", "text/plain", "ok\n".to_string()),
        "/readyz" if ready.load(Ordering::Relaxed) => ("200 OK", "text/plain", "ready\n".to_string()),
        "/readyz" => ("503 Service Unavailable", "text/plain", "starting\n".to_string()),
        _ => return None,
    })
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
