//! The HTTP plumbing of `lacuna serve` on hyper (already in the tree, under reqwest): JSON replies,
//! clear JSON errors, bodies read under a size limit, and Server-Sent Event streams.

use std::convert::Infallible;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::net::TcpListener;

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A reply with `body` as its JSON.
pub fn json_reply(status: StatusCode, body: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec_pretty(body).expect("JSON values serialise");
    reply(status, "application/json", Bytes::from(bytes))
}

pub fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Every error is JSON: `{"error": {"code": "...", "message": "..."}}`, the code a fixed word a
/// client can branch on, the message for people.
pub fn error_reply(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Response<Body> {
    json_reply(status, &json!({"error": {"code": code, "message": message.to_string()}}))
}

/// The request body, at most `limit` bytes: 413 past it, whether announced or streamed.
pub async fn read_body(request: Request<Incoming>, limit: usize) -> Result<Bytes, Response<Body>> {
    let too_large = || {
        error_reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request body is over {limit} bytes (serve.max_body_bytes)"),
        )
    };
    let announced = request.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if announced.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(error) => Err(error_reply(StatusCode::BAD_REQUEST, "bad_body", format!("cannot read the body: {error}"))),
    }
}

/// A `text/event-stream` reply of `chunks`, each already formatted as SSE.
pub fn sse_reply(chunks: impl Stream<Item = Bytes> + Send + 'static) -> Response<Body> {
    let body = StreamBody::new(chunks.map(|bytes| Ok::<_, Infallible>(Frame::data(bytes))));
    let mut response = Response::new(BodyExt::boxed_unsync(body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    // Proxies that buffer (nginx) would hold the stream back otherwise.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// One SSE event: its id, name and JSON data on one line.
pub fn sse_event(id: usize, name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("id: {id}\nevent: {name}\ndata: {data}\n\n"))
}

/// Serves `handle` on `listener` until the process ends, one task per connection.
pub fn serve<H, F>(listener: TcpListener, handle: Arc<H>)
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, typically: wait rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let reply = handle(request);
                    async move { Ok::<_, Infallible>(reply.await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(error) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                    tracing::debug!(%error, "connection ended with an error");
                }
            });
        }
    });
}
