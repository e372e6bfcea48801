//! The HTTP plumbing of `lacuna serve` on axum: JSON replies and errors, bodies read under a size
//! and time limit, the layers every route shares (CORS, request counting, JSON 405s), and the
//! bearer-token check of the question and document routes.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue, LOCATION, RETRY_AFTER};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Limited};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::config::ServeSettings;
use crate::metrics::METRICS;
use crate::topics::BusError;

/// A JSON reply: `body` pretty-printed, `application/json`.
pub fn json_reply(status: StatusCode, body: &impl Serialize) -> Response {
    let bytes = serde_json::to_vec_pretty(body).expect("replies serialise");
    (status, [(CONTENT_TYPE, "application/json")], bytes).into_response()
}

/// The JSON of every error: `{"error": {"code": "...", "message": "..."}}`, the code a fixed word a
/// client can branch on, the message for people.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
    /// With `unavailable` on a batch: the questions published before the bus failed, which were
    /// accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted: Option<Vec<String>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    TooLarge,
    Timeout,
    UnsupportedMediaType,
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    Conflict,
    TooManyOpen,
    TooManyStreams,
    Unavailable,
}

/// A refused request: the reply, and the reason `lacuna_serve_rejected_total` counts it under.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
    pub reason: &'static str,
    /// `Retry-After` in seconds (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl std::fmt::Display) -> Self {
        let reason = match code {
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::TooManyOpen => "too_many_open",
            ErrorCode::TooManyStreams => "too_many_streams",
            ErrorCode::Unavailable => "unavailable",
            _ => "bad_request",
        };
        ApiError {
            status,
            body: ErrorBody { error: ErrorDetail { code, message: message.to_string() }, accepted: None },
            reason,
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl std::fmt::Display) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
    }

    pub fn not_found(message: impl std::fmt::Display) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, message)
    }

    /// A publish that failed. One the bus will never take is refused for good, with no `Retry-After`:
    /// 413 when it is over the bus's message size, 500 otherwise (not authorised, no such topic: for
    /// the operator). Any other failure is a 503, worth a retry after `retry_after_s`.
    pub fn publish_failed(error: &BusError, what: &str, retry_after_s: u64) -> Self {
        let message = format!("the bus did not take {what}: {error}");
        match error {
            BusError::Rejected(reason) if reason.to_lowercase().replace(' ', "").contains("toolarge") => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::TooLarge, message)
            }
            BusError::Rejected(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Unavailable, message),
            _ => {
                let mut refused = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, message);
                refused.retry_after = Some(retry_after_s);
                refused
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        METRICS.serve_rejected.with_label_values(&[self.reason]).inc();
        let mut response = json_reply(self.status, &self.body);
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A reply with a `Location` header.
pub fn with_location(mut response: Response, location: &str) -> Response {
    let value = HeaderValue::from_str(location).expect("locations are built from URL-safe ids");
    response.headers_mut().insert(LOCATION, value);
    response
}

/// The request body, at most `limit` bytes (413 past it, whether announced or streamed), whole
/// within `deadline` (408 past it): a client that trickles its body cannot hold a handler and its
/// buffer for long, however steadily it sends.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize, deadline: Duration) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooLarge,
            format!("the request body is over {limit} bytes (serve.max_body_bytes)"),
        )
    };
    let announced = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if announced.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let Ok(collected) = tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await else {
        return Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::Timeout,
            format!("the request body did not arrive within {} ms (serve.body_timeout_ms)", deadline.as_millis()),
        ));
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(error) => Err(ApiError::bad_request(format!("cannot read the body: {error}"))),
    }
}

/// 415 unless the request says its body is `application/json` (parameters such as `charset` are
/// fine): a browser sends a cross-site form as text/plain or a form encoding without a CORS
/// preflight, and it must not submit questions.
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let declared = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let essence = declared.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ErrorCode::UnsupportedMediaType,
        format!("the body must be application/json, not {:?}", declared),
    ))
}

/// The JSON body as a value: 400 when it is not JSON.
pub fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))
}

/// CORS for the origins in `serve.cors_origins` ("*": any), echoed back one at a time, with the
/// headers a browser client needs; none listed, none granted. Preflights answer 204.
pub fn cors(settings: &ServeSettings) -> CorsLayer {
    let origins = settings.cors_origins.clone();
    let allowed = AllowOrigin::predicate(move |origin: &HeaderValue, _| {
        origin.to_str().is_ok_and(|origin| origins.iter().any(|o| o == "*" || o == origin))
    });
    CorsLayer::new()
        .allow_origin(allowed)
        .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
        .allow_headers([
            "authorization".parse().expect("a header name"),
            CONTENT_TYPE,
            "idempotency-key".parse().expect("a header name"),
            "last-event-id".parse().expect("a header name"),
        ])
        .expose_headers([LOCATION, RETRY_AFTER])
        .max_age(Duration::from_secs(600))
}

/// The route a reply answered for, as its matched path (`/v1/questions/{id}`): set inside the
/// router, read by [`count`] outside it.
#[derive(Clone, Debug)]
pub struct RouteLabel(pub String);

/// Counts every reply by route and status (`lacuna_serve_requests_total`), and gives preflights
/// their 204 (CORS answers them with 200 and no body).
pub async fn count(request: Request, next: Next) -> Response {
    let preflight =
        request.method() == Method::OPTIONS && request.headers().contains_key("access-control-request-method");
    let mut response = next.run(request).await;
    let matched = response.extensions().get::<RouteLabel>().map(|r| r.0.clone());
    if preflight && response.status() == StatusCode::OK {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    let route = match (preflight, response.status(), matched) {
        (true, _, _) => "preflight".to_string(),
        (_, StatusCode::UNAUTHORIZED, _) => "unauthorized".to_string(),
        (_, StatusCode::METHOD_NOT_ALLOWED, _) | (_, _, None) => "other".to_string(),
        (_, _, Some(route)) => route,
    };
    METRICS.serve_requests.with_label_values(&[&route, response.status().as_str()]).inc();
    response
}

/// An unknown method on a known route: 405 with the methods it has in `Allow`, as JSON.
pub async fn method_not_allowed(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let response = next.run(request).await;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    let allow = response.headers().get("allow").cloned();
    let mut refused = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed on {path}"),
    )
    .into_response();
    if let Some(allow) = allow {
        refused.headers_mut().insert("allow", allow);
    }
    refused
}

/// Whether the request's `Authorization: Bearer` is `token`, compared in constant time.
pub fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let (given, wanted) = (Sha256::digest(given.as_bytes()), Sha256::digest(token.as_bytes()));
    bool::from(given.ct_eq(&wanted))
}
